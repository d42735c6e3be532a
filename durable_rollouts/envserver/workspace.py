"""The workspace capability: a directory plus an asyncssh server whose commands run sandboxed.

``Workspace.start()`` (run from an environment's initialize hook) creates the directory, generates
per-serve ed25519 host and client keys in memory (never written to disk), binds an asyncssh server
to 127.0.0.1 and returns the ``ssh/2`` :class:`Capability` that ``hello`` publishes. Every exec'd
command (or interactive shell) runs as ``bash`` inside bubblewrap when it is available:

- only system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc`` ...) are visible, read-only; the
  rest of the host (the environment's own files, graders, hidden tests) is simply not mounted, and
  ``hide`` paths that do lie under a system directory are covered with an empty tmpfs;
- the workspace directory is writable at ``/workspace``; ``/tmp`` is a private tmpfs; ``/`` is
  remounted read-only;
- no network unless ``network=True`` (``--unshare-net``), own pid/ipc/uts/user namespaces,
  ``--die-with-parent``; a command past ``timeout_s`` is killed (exit status 124).

Without a working bwrap the commands run unsandboxed in the real directory: the capability says
``isolation: "none"`` and a warning is logged once per process.

Imports asyncssh, ``durable_rollouts.errors`` and ``.environment`` only; never the server, the
client or anything under ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import asyncssh

from ..errors import EnvError
from .environment import Capability

if TYPE_CHECKING:
    from .environment import Environment

__all__ = ["Mount", "Workspace", "add_workspace", "bwrap_available"]

log = logging.getLogger(__name__)

SANDBOX_CWD = "/workspace"
TIMEOUT_EXIT_STATUS = 124
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_warned_no_bwrap = False

Isolation = Literal["auto", "bwrap", "none"]


@dataclass(frozen=True)
class Mount:
    """An extra bind mount inside the sandbox (read-only unless ``writable``)."""

    source: str
    target: str
    writable: bool = False

    @classmethod
    def parse(cls, spec: Mount | str | tuple[str, str] | dict[str, Any]) -> Mount:
        """A Mount, ``"SRC:DST[:rw|ro]"``, ``(src, dst)`` or ``{source, target, writable}``."""
        if isinstance(spec, Mount):
            return spec
        if isinstance(spec, dict):
            return cls(**spec)
        if isinstance(spec, tuple):
            return cls(str(spec[0]), str(spec[1]))
        parts = str(spec).split(":")
        if len(parts) == 1:
            return cls(parts[0], parts[0])
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            return cls(parts[0], parts[1], writable=parts[2] == "rw")
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ValueError(f"bad mount spec {spec!r}: expected SRC[:DST[:ro|rw]]")


def bwrap_available() -> str | None:
    """The path of the ``bwrap`` binary, or None."""
    return shutil.which("bwrap")


def _warn_no_isolation(reason: str) -> None:
    global _warned_no_bwrap
    if not _warned_no_bwrap:
        _warned_no_bwrap = True
        log.warning("workspace commands run WITHOUT a sandbox (isolation 'none'): %s", reason)


class _SSHServer(asyncssh.SSHServer):
    """Public-key auth only (the one generated client key, the one user); no forwarding."""

    def __init__(self, user: str, client_public: asyncssh.SSHKey,
                 live: set[asyncssh.SSHServerConnection]) -> None:
        self._user = user
        self._client_public = client_public.export_public_key()
        self._live = live
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._live.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._live.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self._user and key.export_public_key() == self._client_public

    # No forwarding of any kind: it would hand the sandboxed agent the env host's network.
    def connection_requested(self, *args: Any) -> bool:
        return False

    def server_requested(self, *args: Any) -> bool:
        return False

    def unix_connection_requested(self, *args: Any) -> bool:
        return False

    def unix_server_requested(self, *args: Any) -> bool:
        return False


class Workspace:
    """A sandboxed directory reachable over ssh. See the module docstring for the sandbox.

    Args:
        root: the workspace directory (created at start); None = a temporary directory that is
            removed at stop.
        name: the capability name.
        user: the ssh user name clients must use.
        network: give commands the host network (default: none at all).
        mounts: extra bind mounts (``Mount`` or ``"SRC:DST[:ro|rw]"``), read-only by default.
        hide: host paths that must stay invisible even if they lie under a system directory.
        timeout_s: a command running longer is killed (exit status 124).
        isolation: ``auto`` (bwrap if it works), ``bwrap`` (required) or ``none``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        name: str = "shell",
        user: str = "agent",
        network: bool = False,
        mounts: Iterable[Mount | str | tuple[str, str] | dict[str, Any]] = (),
        hide: Iterable[str | os.PathLike[str]] = (),
        timeout_s: float = 300.0,
        isolation: Isolation = "auto",
        shell: str = "bash",
    ) -> None:
        if isolation not in ("auto", "bwrap", "none"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'none', not {isolation!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.name = name
        self.user = user
        self.network = network
        self.mounts = [Mount.parse(m) for m in mounts]
        self.hide = [Path(p).resolve() for p in hide]
        self.timeout_s = timeout_s
        self.requested_isolation: Isolation = isolation
        self.shell = shell
        self._root_arg = Path(root).resolve() if root is not None else None
        self.root: Path | None = self._root_arg
        self.isolation: Literal["bwrap", "none"] | None = None
        self.capability: Capability | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._conns: set[asyncssh.SSHServerConnection] = set()
        self._temp_root = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Capability:
        """Create the directory and keys, start the ssh server; returns the capability."""
        if self.capability is not None:
            return self.capability
        if self._root_arg is None:
            self.root = Path(tempfile.mkdtemp(prefix="rollouts-ws-"))
            self._temp_root = True
        else:
            self._root_arg.mkdir(parents=True, exist_ok=True)
            self.root = self._root_arg
        self.isolation = await self._choose_isolation()
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        client_public = client_key.convert_to_public()
        self._acceptor = await asyncssh.create_server(
            lambda: _SSHServer(self.user, client_public, self._conns),
            "127.0.0.1",
            0,
            server_host_keys=[host_key],
            process_factory=self._handle,
            encoding=None,
            allow_pty=False,
            x11_forwarding=False,
            agent_forwarding=False,
            allow_scp=False,
            config=None,
        )
        port = self._acceptor.sockets[0].getsockname()[1]
        cwd = SANDBOX_CWD if self.isolation == "bwrap" else str(self.root)
        self.capability = Capability(
            name=self.name,
            protocol="ssh/2",
            url=f"ssh://{self.user}@127.0.0.1:{port}",
            params={
                "user": self.user,
                "host_pubkey": host_key.export_public_key().decode().strip(),
                "client_key": client_key.export_private_key().decode(),
                "cwd": cwd,
                "shell": self.shell,
                "isolation": self.isolation,
                "network": self.network,
                "timeout_s": self.timeout_s,
            },
        )
        return self.capability

    async def stop(self) -> None:
        """Close the ssh server, kill running commands, remove a temporary root."""
        if self._acceptor is not None:
            self._acceptor.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._acceptor.wait_closed(), 5)
            self._acceptor = None
        for conn in list(self._conns):
            conn.close()
        for proc in list(self._procs):
            _kill_group(proc)
        self.capability = None
        if self._temp_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self._temp_root = False

    # -- sandbox -------------------------------------------------------------------------------

    async def _choose_isolation(self) -> Literal["bwrap", "none"]:
        if self.requested_isolation == "none":
            return "none"
        for m in self.mounts:  # a typo in a mount must fail loudly, never disable the sandbox
            if not Path(m.source).exists():
                raise EnvError(f"workspace {self.name!r}: mount source {m.source} does not exist")
        reason = "bwrap is not installed"
        if bwrap_available():
            probe = await asyncio.create_subprocess_exec(
                *self.sandbox_argv(["true"]),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": _PATH},
            )
            try:
                _, err = await asyncio.wait_for(probe.communicate(), 10)
            except TimeoutError:
                probe.kill()
                await probe.wait()
                err = b"probe timed out"
            if probe.returncode == 0:
                return "bwrap"
            reason = f"bwrap does not work here: {err.decode(errors='replace').strip()}"
        if self.requested_isolation == "bwrap":
            raise EnvError(f"workspace {self.name!r} requires bwrap isolation: {reason}")
        _warn_no_isolation(reason)
        return "none"

    def sandbox_argv(self, command: Sequence[str], *, mounts: Iterable[Mount | str] = (),
                     env: dict[str, str] | None = None) -> list[str]:
        """The bwrap command line that runs ``command`` in this workspace's sandbox.

        ``mounts`` are added for this command only (e.g. a grader's hidden tests, read-only).
        The sandbox starts from an empty environment plus ``env`` (PATH and HOME are set).
        """
        assert self.root is not None
        # No --new-session: the command has no terminal (so no TIOCSTI risk) and must stay in
        # bwrap's process group, so one killpg reaches it even if bwrap dies before the child
        # armed --die-with-parent; whatever leaves the group dies with the pid namespace.
        argv = ["bwrap", "--die-with-parent", "--unshare-all"]
        if self.network:
            argv.append("--share-net")
        argv += ["--unshare-user", "--uid", "1000", "--gid", "1000", "--clearenv"]
        for key, value in self._environ(env or {}).items():
            argv += ["--setenv", key, value]
        for path in _SYSTEM_DIRS:
            p = Path(path)
            if p.is_symlink():
                argv += ["--symlink", os.readlink(p), path]
            elif p.is_dir():
                argv += ["--ro-bind", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for hidden in self.hide:
            if not any(hidden.is_relative_to(d) for d in _SYSTEM_DIRS if Path(d).is_dir()):
                continue  # not mounted at all, so already invisible
            if hidden.is_dir():
                argv += ["--tmpfs", str(hidden)]
            elif hidden.exists():
                argv += ["--ro-bind", "/dev/null", str(hidden)]
        for m in [*self.mounts, *(Mount.parse(x) for x in mounts)]:
            argv += ["--bind" if m.writable else "--ro-bind", m.source, m.target]
        argv += ["--bind", str(self.root), SANDBOX_CWD, "--remount-ro", "/", "--chdir", SANDBOX_CWD]
        return [*argv, "--", *command]

    def shell_command(self, command: str, *, mounts: Iterable[Mount | str] = (),
                      env: dict[str, str] | None = None) -> str:
        """A ``bash -lc``-ready string running ``command`` the way the agent's commands run.

        Graders use it to run checks against the workspace files inside the same sandbox, with
        their hidden files mounted read-only for that one command. Without bwrap it is
        ``cd ROOT && command`` (``mounts`` are then ignored: the host paths are used as they are).
        """
        assert self.root is not None, "the workspace has not started"
        if self.isolation == "bwrap":
            argv = self.sandbox_argv([self.shell, "-lc", command], mounts=mounts, env=env)
            return shlex.join(argv)
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        return f"cd {shlex.quote(str(self.root))} && {exports}{command}"

    def _command_argv(self, command: str | None, env: dict[str, str]) -> list[str]:
        shell = [self.shell, "-lc", command] if command is not None else [self.shell, "-s"]
        if self.isolation == "bwrap":
            return self.sandbox_argv(shell, env=env)
        return shell

    def _environ(self, requested: dict[str, str]) -> dict[str, str]:
        # Never the server's own environment: it may hold secrets (API keys, tokens).
        home = SANDBOX_CWD if self.isolation == "bwrap" else str(self.root)
        env = {"PATH": _PATH, "HOME": home, "LANG": "C.UTF-8", "USER": self.user, "TERM": "dumb"}
        env.update({k: v for k, v in requested.items() if k not in ("PATH", "HOME")})
        return env

    # -- one ssh session -----------------------------------------------------------------------

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        if process.subsystem:
            process.stderr.write(f"subsystem {process.subsystem!r} is not supported\n".encode())
            process.exit(1)
            return
        requested = {str(k): str(v) for k, v in dict(process.env).items()}
        cwd = None if self.isolation == "bwrap" else str(self.root)
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *self._command_argv(process.command, requested),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=self._environ(requested),
            start_new_session=True,
        ))
        try:
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:  # the session went away while the command was starting
            with contextlib.suppress(BaseException):
                _kill_group(await spawn)
            raise
        except OSError as exc:
            process.stderr.write(f"cannot start command: {exc}\n".encode())
            process.exit(127)
            return
        self._procs.add(proc)
        assert proc.stdin and proc.stdout and proc.stderr
        feed = asyncio.create_task(_copy_in(process, proc.stdin))
        outs = [asyncio.create_task(_copy_out(proc.stdout, process.stdout)),
                asyncio.create_task(_copy_out(proc.stderr, process.stderr))]
        exited = asyncio.create_task(proc.wait())
        hangup = asyncio.create_task(process.channel.wait_closed())
        try:
            await asyncio.wait({exited, hangup}, timeout=self.timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():  # timed out, or the client went away: no orphans either way
                _kill_group(proc)
                await exited
                if hangup.done():
                    for task in outs:
                        task.cancel()
                    return
                note = f"\ncommand killed after {self.timeout_s:g}s timeout\n"
                process.stderr.write(note.encode())
                status = TIMEOUT_EXIT_STATUS
            else:
                status = exited.result()
        finally:
            self._procs.discard(proc)
            if proc.returncode is None:
                _kill_group(proc)
            for task in (feed, hangup, exited):
                task.cancel()
        # Drain what the command wrote; a background child holding the pipes open is not waited for.
        await asyncio.wait(outs, timeout=2)
        for task in outs:
            task.cancel()
        process.exit(status if status >= 0 else 128 - status)


async def _copy_in(process: asyncssh.SSHServerProcess[bytes], sink: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await process.stdin.read(65536)
            if not data:
                break
            sink.write(data)
            await sink.drain()
    except (OSError, asyncssh.Error, asyncssh.BreakReceived, asyncssh.SignalReceived,
            asyncssh.TerminalSizeChanged):
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()


async def _copy_out(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    with contextlib.suppress(OSError, asyncssh.Error):
        while True:
            data = await source.read(65536)
            if not data:
                break
            sink.write(data)
            await sink.drain()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def add_workspace(
    env: Environment,
    root: str | os.PathLike[str] | None = None,
    *,
    name: str = "shell",
    hide: Iterable[str | os.PathLike[str]] | None = None,
    **kwargs: Any,
) -> Workspace:
    """Declare a workspace on ``env``: started by an initialize hook, stopped at shutdown.

    The environment's own directory (where its ``env.py`` lives) is hidden from the sandbox by
    default. Returns the :class:`Workspace` (its ``root`` is concrete once the env serves).
    """
    if hide is None:
        hide = [Path(env.source).parent] if env.source else []
    ws = Workspace(root, name=name, hide=hide, **kwargs)

    async def _start_workspace() -> None:
        env.add_capability(await ws.start())

    async def _stop_workspace() -> None:
        await ws.stop()

    _start_workspace.__qualname__ = f"workspace[{name}].start"
    _stop_workspace.__qualname__ = f"workspace[{name}].stop"
    env.initialize(_start_workspace)
    env.shutdown(_stop_workspace)
    return ws
