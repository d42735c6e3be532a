"""SSHRuntime: serve the env on another host over SSH (asyncssh, imported lazily).

``acquire`` connects to the host, copies the task's env file into the remote work directory
(content-addressed, so a second rollout finds it), checks that the remote Python can import
``durable_rollouts`` and uploads this package next to it when it cannot, then starts
``python -m durable_rollouts.envserver ENV --host 127.0.0.1 --port 0`` in its own session
(``setsid``, output to a log file, pid recorded) and reads the announced port from the log. The
remote port is local-forwarded (``forward_local_port``) to an ephemeral port on this machine's
loopback. The forward lives in this process, hence locality ``process``; a retried acquire in a
new process finds the remote server by key (its pid file) and forwards to it again.

Remote layout under ``workdir``::

    envs/<sha>/<env file>            the env file, content-addressed
    pkg/<sha>/durable_rollouts/      this package, when the remote Python lacks it
    substrates/<key>/{pid,port,token,log}

The server's token is the rollout key's derived token (``sdk.tokens``): it travels in a mode-600
file, never on a command line nor in the Endpoint (later steps derive it again); a server found
with another token (another worker secret) is restarted. ``release`` kills the remote
process group and removes the key's directory (idempotent). Imports models, errors and the
provider base only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..client.tokens import derived_params, substrate_token
from ..errors import ConfigError, ProviderError
from ..models import Endpoint, ProviderSpec, Task
from ..paths import safe_name
from ..protocol import SERVE_PORT_ANNOUNCEMENT
from ..settings import var
from .base import DurableProvider, Locality, probe_ready

__all__ = ["SSHRuntime"]

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../durable_rollouts


@dataclass
class _Forward:
    conn: Any
    listener: Any
    remote_port: int


# Live forwards of this process, by rollout key (the reason for locality "process").
_FORWARDS: dict[str, _Forward] = {}
_package_digest: str | None = None


def _digest_package() -> str:
    global _package_digest
    if _package_digest is None:
        h = hashlib.sha256()
        for path in sorted(_PACKAGE_DIR.rglob("*.py")):
            h.update(str(path.relative_to(_PACKAGE_DIR)).encode())
            h.update(path.read_bytes())
        _package_digest = h.hexdigest()[:16]
    return _package_digest


class SSHRuntime(DurableProvider):
    """Run each rollout's environment as a process on an SSH host.

    Args:
        host: the SSH host.
        user: the remote user.
        key: path of the private key used to log in.
        python: the remote Python (a path or a name on the remote PATH).
        workdir: remote work directory (relative paths are relative to the remote home).
        port: the SSH port.
        known_hosts: a known_hosts file checking the host key (default: the user's
            ``~/.ssh/known_hosts``).
        env: the environment name inside the env file, when it defines several.
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "ssh"
    locality: ClassVar[Locality] = "process"
    honours: ClassVar[frozenset[str]] = frozenset(
        {"limits.startup_timeout_s", "limits.run_timeout_s"}
    )

    def __init__(
        self,
        host: str,
        user: str,
        key: str,
        *,
        python: str = "python3",
        workdir: str = ".durable-rollouts",
        port: int = 22,
        known_hosts: str | None = None,
        env: str | None = None,
        max_provisions_per_s: float | None = None,
        max_substrates: int | None = None,
    ) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.host, self.user, self.key = host, user, str(key)
        self.python, self.workdir, self.port = python, str(workdir).rstrip("/") or ".", int(port)
        self.known_hosts, self.env = known_hosts, env

    def __repr__(self) -> str:
        return f"SSHRuntime({self.user}@{self.host}:{self.port})"

    def spec(self) -> ProviderSpec:
        options = {
            "host": self.host,
            "user": self.user,
            "key": self.key,
            "python": self.python,
            "workdir": self.workdir,
            "port": self.port,
            "known_hosts": self.known_hosts,
            "env": self.env,
        }
        return ProviderSpec(
            kind=self.kind, options={k: v for k, v in options.items() if v is not None}
        )

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SSHRuntime:
        opts = dict(options)
        return cls(opts.pop("host"), opts.pop("user"), opts.pop("key"), **opts)

    # -- SSH plumbing -------------------------------------------------------------------------

    async def _connect(self) -> Any:
        try:
            import asyncssh
        except ImportError as exc:  # pragma: no cover - asyncssh is a dependency
            raise ConfigError("SSHRuntime needs the 'asyncssh' package") from exc
        kwargs: dict[str, Any] = {"username": self.user, "client_keys": [self.key]}
        if self.known_hosts is not None:
            kwargs["known_hosts"] = self.known_hosts
        try:
            return await asyncssh.connect(self.host, self.port, **kwargs)
        except (asyncssh.PermissionDenied, asyncssh.HostKeyNotVerifiable) as exc:
            raise ConfigError(
                f"SSH login to {self.user}@{self.host}:{self.port} refused: {exc}"
            ) from exc
        except (OSError, asyncssh.Error) as exc:
            raise ProviderError(f"cannot reach SSH host {self.host}:{self.port}: {exc}") from exc

    @staticmethod
    async def _sh(conn: Any, script: str, *, check: bool = True) -> Any:
        result = await conn.run(script, check=False)
        if check and result.exit_status != 0:
            raise ProviderError(
                f"remote command failed ({result.exit_status}): "
                f"{(result.stderr or result.stdout or '').strip()[-2000:]}"
            )
        return result

    def _dir(self, key: str) -> str:
        """The key's state directory, relative to the work directory."""
        digest = hashlib.sha1(key.encode()).hexdigest()[:10]
        return f"substrates/{safe_name(key)[:80]}-{digest}"

    def _in_wd(self, script: str) -> str:
        """``script`` run inside the (created if needed) work directory, with ``alive PID``."""
        wd = shlex.quote(self.workdir)
        return f"{_ALIVE_FN}; mkdir -p {wd} && cd {wd} && {{ {script}; }}"

    async def _upload_env(self, conn: Any, source: str) -> str:
        """Copy the env file to ``envs/<sha>/`` unless it is already there; its remote path."""
        local = Path(source)
        if not local.is_file():
            raise ConfigError(f"SSHRuntime needs the task's env file; {source!r} is not a file")
        data = local.read_bytes()
        rel = f"envs/{hashlib.sha256(data).hexdigest()[:16]}/{local.name}"
        await self._sh(conn, self._in_wd(f"mkdir -p {shlex.quote(rel.rsplit('/', 1)[0])}"))
        remote = f"{self.workdir}/{rel}"
        async with conn.start_sftp_client() as sftp:
            if not await sftp.exists(remote):
                part = f"{remote}.{secrets.token_hex(4)}.part"
                await sftp.put(str(local), part)
                try:
                    await sftp.posix_rename(part, remote)
                except Exception:  # a concurrent upload of the same content won
                    await sftp.remove(part)
        return rel

    async def _pythonpath(self, conn: Any) -> str:
        """'' when the remote Python imports durable_rollouts, else the uploaded copy (relative)."""
        probe = f"{shlex.quote(self.python)} -c 'import durable_rollouts.envserver'"
        if (await self._sh(conn, self._in_wd(probe), check=False)).exit_status == 0:
            return ""
        rel = f"pkg/{_digest_package()}"
        if (
            await self._sh(conn, self._in_wd(f"test -f {rel}/.complete"), check=False)
        ).exit_status != 0:
            log.info("uploading durable_rollouts to %s:%s/%s", self.host, self.workdir, rel)
            await self._sh(conn, self._in_wd(f"rm -rf {rel} && mkdir -p {rel}"))
            async with conn.start_sftp_client() as sftp:
                await sftp.put(
                    str(_PACKAGE_DIR), f"{self.workdir}/{rel}/durable_rollouts", recurse=True
                )
            await self._sh(conn, self._in_wd(f"touch {rel}/.complete"))
        check = await self._sh(conn, self._in_wd(f'PYTHONPATH="$PWD/{rel}" {probe}'), check=False)
        if check.exit_status != 0:
            raise ConfigError(
                f"remote {self.python} on {self.host} cannot run the env server even "
                f"with this package uploaded (it needs pydantic): {check.stderr.strip()[-500:]}"
            )
        return rel

    # -- contract -----------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Start (or find) the remote env server for ``key`` and forward its port here."""
        self.check_task(task)
        if not task.source:
            raise ConfigError(f"task {task.slug} has no source env file for SSHRuntime")
        limits = task.runtime_config.limits if task.runtime_config else None
        startup = (limits.startup_timeout_s if limits else None) or DEFAULT_STARTUP_TIMEOUT_S
        run_timeout = limits.run_timeout_s if limits else None
        conn = await self._connect()
        try:
            token = substrate_token(key)
            remote_port = await self._remote_server(conn, task, key, token, startup, run_timeout)
            old = _FORWARDS.pop(key, None)
            if old is not None:
                _close_forward(old)
            listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", remote_port)
        except BaseException:
            conn.close()
            raise
        _FORWARDS[key] = _Forward(conn, listener, remote_port)
        url = f"tcp://127.0.0.1:{listener.get_port()}"
        try:
            await probe_ready(url, token, startup)
        except BaseException:
            await self.release_key(key)
            raise
        return Endpoint(
            url=url,
            params=derived_params(ready_timeout=startup),
            config=task.runtime_config,
            provider=self.spec(),
            key=key,
            handle={
                "host": self.host,
                "dir": f"{self.workdir}/{self._dir(key)}",
                "remote_port": remote_port,
            },
        )

    async def _remote_server(
        self,
        conn: Any,
        task: Task,
        key: str,
        token: str,
        startup: float,
        run_timeout: float | None,
    ) -> int:
        """The port of ``key``'s env server on the host: the running one, else a new one."""
        d = self._dir(key)
        port = await self._running_port(conn, key, token)
        if port is not None:
            return port
        await self._sh(conn, self._in_wd(_kill_script(d) + f"; rm -rf {d}; mkdir -p {d}"))
        await self._launch(conn, task, d, token, run_timeout)
        return await self._announced_port(conn, key, startup)

    async def _running_port(self, conn: Any, key: str, token: str) -> int | None:
        """The port of a live server for ``key`` started with ``token``; None to (re)start it."""
        d = self._dir(key)
        alive = await self._sh(
            conn,
            self._in_wd(
                f'if [ -f {d}/pid ] && [ -f {d}/port ] && alive "$(cat {d}/pid)"; '
                f'then echo "ALIVE $(cat {d}/port)"; cat {d}/token; else echo GONE; fi'
            ),
        )
        first, _, rest = alive.stdout.partition("\n")
        if first.startswith("ALIVE "):
            if hmac.compare_digest(rest.strip(), token):
                log.info("reusing remote env server for %s on %s", key, self.host)
                return int(first.split()[1])
            log.info("restarting env server for %s on %s: other token secret", key, self.host)
        return None

    async def _launch(self, conn: Any, task: Task, d: str, token: str,
                      run_timeout: float | None) -> None:
        """Upload the env (and the package if needed) and start its server in ``d``."""
        env_rel = await self._upload_env(conn, task.source or "")
        pythonpath = await self._pythonpath(conn)
        async with conn.start_sftp_client() as sftp:
            async with sftp.open(f"{self.workdir}/{d}/token", "w", attrs=_sftp_attrs(0o600)) as fh:
                await fh.write(token)
        env_dir, env_file = env_rel.rsplit("/", 1)
        cmd = [
            self.python,
            "-m",
            "durable_rollouts.envserver",
            env_file,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]
        if self.env:
            cmd += ["--env", self.env]
        if run_timeout:
            cmd = ["timeout", "-k", "10", f"{run_timeout:g}", *cmd]
        pp = f'PYTHONPATH="$wd/{pythonpath}" ' if pythonpath else ""
        # The subshell is no process-group leader, so `exec setsid` keeps its pid: $! is the
        # server's pid and its process-group id, which release kills as a group.
        await self._sh(
            conn,
            self._in_wd(
                f'wd=$(pwd); ( cd {env_dir} && {var("env_token")}="$(cat "$wd/{d}/token")" {pp}'
                f"exec setsid {' '.join(shlex.quote(c) for c in cmd)} "
                f'>"$wd/{d}/log" 2>&1 </dev/null ) & echo $! > {d}/pid'
            ),
        )

    async def _announced_port(self, conn: Any, key: str, startup: float) -> int:
        """Wait for the started server to announce its port (ProviderError with its log if not)."""
        d = self._dir(key)
        ticks = int(startup * 20)
        wait = await self._sh(
            conn,
            self._in_wd(
                f"pid=$(cat {d}/pid); n=0; while :; do "
                f'p=$(sed -n "s/^{SERVE_PORT_ANNOUNCEMENT}\\([0-9][0-9]*\\).*/\\1/p" {d}/log '
                f"| head -n 1); "
                f'if [ -n "$p" ]; then echo "$p" > {d}/port; echo "PORT $p"; exit 0; fi; '
                f'if ! alive "$pid"; then echo DEAD; tail -n {LOG_TAIL_LINES} {d}/log; exit 3; fi; '
                f"n=$((n+1)); if [ $n -gt {ticks} ]; then echo TIMEOUT; "
                f"tail -n {LOG_TAIL_LINES} {d}/log; exit 4; fi; "
                f"sleep 0.05; done"
            ),
            check=False,
        )
        head, _, tail = wait.stdout.partition("\n")
        if wait.exit_status == 0 and head.startswith("PORT "):
            return int(head.split()[1])
        await self._sh(conn, self._in_wd(_kill_script(d)), check=False)
        what = "exited" if head == "DEAD" else f"did not announce its port within {startup:g}s"
        raise ProviderError(
            f"env server for {key} on {self.host} {what}; last {LOG_TAIL_LINES} "
            f"log lines:\n{tail.rstrip() or '(no output)'}"
        )

    async def release(self, endpoint: Endpoint) -> None:
        """Close the forward, kill the remote process group and remove its directory."""
        await self.release_key(endpoint.key)

    async def release_key(self, key: str) -> None:
        fwd = _FORWARDS.pop(key, None)
        if fwd is not None:
            _close_forward(fwd)
        conn = await self._connect()
        try:
            d = self._dir(key)
            await self._sh(conn, self._in_wd(_kill_script(d) + f"; rm -rf {d}"), check=False)
        finally:
            conn.close()


# `kill -0` also succeeds for a zombie (an exited server its new parent has not reaped yet).
_ALIVE_FN = (
    'alive() { kill -0 "$1" 2>/dev/null || return 1; '
    's=$(sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -c1); [ "$s" != Z ]; }'
)


def _kill_script(d: str) -> str:
    return (
        f'if [ -f {d}/pid ]; then pid=$(cat {d}/pid); kill -TERM -- "-$pid" 2>/dev/null; '
        f'i=0; while alive "$pid" && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; '
        f'kill -KILL -- "-$pid" 2>/dev/null; rm -f {d}/pid {d}/port; fi; true'
    )


def _sftp_attrs(mode: int) -> Any:
    import asyncssh

    return asyncssh.SFTPAttrs(permissions=mode)


def _close_forward(fwd: _Forward) -> None:
    fwd.listener.close()
    fwd.conn.close()


