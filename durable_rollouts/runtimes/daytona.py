"""DaytonaRuntime: one Daytona sandbox per rollout key, reached by an SSH local-forward.

``acquire`` boots a sandbox named after the rollout key (``container_name``) from the snapshot
(building the snapshot from ``image`` first when it is missing), or straight from an image, with
the rollout key's derived token (``sdk.tokens``) in the sandbox environment only. It starts the
env server in a background process session of the sandbox (``cd WORKDIR && python -m
durable_rollouts.envserver env.py --host 127.0.0.1 --port PORT``), reads the announced port from
that command's logs, asks Daytona for an SSH access token and local-forwards an ephemeral port on
this machine's loopback to the announced port over Daytona's SSH gateway (``ssh_host``, user =
the access token). The forward lives in this process (locality ``process``); a retried acquire
in a new process finds the sandbox by name and its running server in the session, and forwards
again. Neither the SSH token nor the env token is in the Endpoint.

Sandboxes are ephemeral, never auto-stopped, and carry ``owner_labels`` plus a time to live of
the run timeout and a margin (``ttl_minutes``), so Daytona itself deletes a forgotten one;
``release`` deletes it, and gc lists and deletes the labelled sandboxes of the organisation.

The SSH gateway's host key is checked against the known_hosts file named by
``$ROLLOUTS_DAYTONA_KNOWN_HOSTS``; unset, it is not checked (Daytona publishes none). Credentials
come from the SDK's own environment (``DAYTONA_API_KEY``, ``DAYTONA_API_URL``, ``DAYTONA_TARGET``).
Imports models, errors and the provider base; ``daytona`` and ``asyncssh`` only inside methods.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shlex
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, ClassVar

from ..client.tokens import derived_params, substrate_token
from ..errors import ConfigError, ProviderError, ReadyTimeoutError
from ..models import Endpoint, ProviderSpec, RuntimeConfig, Task
from ..protocol import SERVE_PORT_ANNOUNCEMENT
from ..settings import settings
from .base import (
    CONTAINER_FIELDS,
    DurableProvider,
    Locality,
    Substrate,
    as_config,
    config_options,
    container_name,
    merge_config,
    probe_ready,
)
from .daytona_sdk import (
    MANAGED_LABEL,
    STARTING_STATES,
    daytona_client,
    list_sandboxes,
    resources_for,
    sandbox_by_id,
    snapshot_ready,
    state_of,
)
from .labels import owner_labels

__all__ = ["DaytonaRuntime"]

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 300.0
DEFAULT_RUN_TIMEOUT_S = 3600.0
TTL_MARGIN_S = 600
SESSION = "durable-rollouts-env"
LOG_TAIL_LINES = 40
_POLL_S = 0.25
_SSH_KEEPALIVE_S = 30


class _RedactTokens(logging.Filter):
    """Keeps live SSH access tokens (the gateway's user names) out of asyncssh's log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(a in self.tokens for a in record.args
                                                  if isinstance(a, str)):
            record.args = tuple("<daytona-ssh-token>" if isinstance(a, str) and a in self.tokens
                                else a for a in record.args)
        return True


_REDACT = _RedactTokens()


@dataclass
class _Forward:
    conn: Any
    listener: Any
    token: str

    def close(self) -> None:
        self.listener.close()
        self.conn.close()
        _REDACT.tokens.discard(self.token)


# Live forwards of this process, by rollout key (the reason for locality "process").
_FORWARDS: dict[str, _Forward] = {}


class DaytonaRuntime(DurableProvider):
    """Run each rollout's environment in a Daytona sandbox.

    Args:
        snapshot_name: the Daytona snapshot sandboxes boot from (built from ``image`` when
            missing and ``image`` is given); resources are fixed when a snapshot is built.
        image: a registry image reference: the source of a missing snapshot, or what sandboxes
            boot from when there is no snapshot name. A ``runtime_config.image`` boots that
            image directly.
        command: the shell command serving the env inside the sandbox (run in ``workdir``; it
            must print ``ROLLOUTS_SERVE_PORT=<port>`` as the env server does). Default: ``python
            -m durable_rollouts.envserver env.py --host 127.0.0.1 --port PORT``.
        workdir: where the command runs (Daytona sessions start in the home directory).
        port: the port the default command serves on inside the sandbox.
        ssh_host: Daytona's SSH gateway, ``HOST`` or ``HOST:PORT``.
        ssh_expires_minutes: lifetime of each SSH access token.
        runtime_config: defaults for every task (image, whole cpus, memory, gpu count, limits).
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "daytona"
    locality: ClassVar[Locality] = "process"
    honours: ClassVar[frozenset[str]] = CONTAINER_FIELDS

    def __init__(
        self,
        snapshot_name: str | None = None,
        *,
        image: str | None = None,
        command: str | None = None,
        workdir: str | None = "/app",
        port: int = 8765,
        ssh_host: str = "ssh.app.daytona.io",
        ssh_expires_minutes: int = 1440,
        runtime_config: RuntimeConfig | dict[str, Any] | None = None,
        max_provisions_per_s: float | None = None,
        max_substrates: int | None = None,
    ) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.snapshot_name, self.image, self.command = snapshot_name, image, command
        self.workdir, self.port = workdir, int(port)
        self.ssh_host, self.ssh_expires_minutes = ssh_host, int(ssh_expires_minutes)
        self.runtime_config = as_config(runtime_config)
        self.check_config(self.runtime_config, what="DaytonaRuntime(runtime_config=...)")
        if snapshot_name is None and image is None and not (
            self.runtime_config and self.runtime_config.image
        ):
            raise ConfigError(
                "DaytonaRuntime needs a snapshot name, image= or runtime_config.image"
            )
        self._ssh_address()  # a malformed ssh_host fails here, not in the first rollout
        self._snapshot_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"DaytonaRuntime({self.snapshot_name!r}, image={self.image!r})"

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {
            "snapshot_name": self.snapshot_name,
            "image": self.image,
            "command": self.command,
            "workdir": self.workdir,
            "port": self.port,
            "ssh_host": self.ssh_host,
            "ssh_expires_minutes": self.ssh_expires_minutes,
            **config_options(self.runtime_config),
        }
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DaytonaRuntime:
        opts = dict(options)
        return cls(opts.pop("snapshot_name", None), **opts)

    def _ssh_address(self) -> tuple[str, int]:
        host, sep, port = self.ssh_host.rpartition(":")
        if not sep:
            return self.ssh_host, 22
        if not host or not port.isdigit():
            raise ConfigError(
                f"DaytonaRuntime ssh_host {self.ssh_host!r}: expected HOST or HOST:PORT"
            )
        return host, int(port)

    def _serve_command(self) -> str:
        command = self.command or (
            f"python -m durable_rollouts.envserver env.py --host 127.0.0.1 --port {self.port}"
        )
        return f"cd {shlex.quote(self.workdir)} && {command}" if self.workdir else command

    # -- contract -----------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Boot (or find) the sandbox for ``key``, serve the env in it, forward it here."""
        self.check_task(task)
        config = merge_config(self.runtime_config, task.runtime_config)
        startup = config.limits.startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S
        token = substrate_token(key)
        async with daytona_client("DaytonaRuntime") as daytona:
            sandbox = await self._find(daytona, key, startup)
            reused = sandbox is not None
            if sandbox is None:
                sandbox = await self._create(daytona, task, key, config, startup)
            try:
                cmd_id = await self._start_server(sandbox)
                remote_port = await self._announced_port(sandbox, cmd_id, startup)
                url = await self._forward(sandbox, key, remote_port)
                await probe_ready(
                    url, token, startup, died=lambda: self._exited(sandbox, cmd_id), poll_s=0.5
                )
            except BaseException:
                _close_forward(key)
                with suppress(Exception):
                    await asyncio.shield(daytona.delete(sandbox))
                raise
        log.info("%s Daytona sandbox %s for %s at %s", "reusing" if reused else "created",
                 sandbox.id, key, url)
        return Endpoint(
            url=url,
            params=derived_params(ready_timeout=startup),
            config=config,
            provider=self.spec(),
            key=key,
            handle={"sandbox_id": sandbox.id, "remote_port": remote_port},
        )

    async def _find(self, daytona: Any, key: str, startup: float) -> Any | None:
        """``key``'s sandbox when it is (or is about to be) running; one past use is deleted."""
        from daytona import DaytonaNotFoundError

        try:
            sandbox = await daytona.get(container_name(key))
        except DaytonaNotFoundError:
            return None
        state = state_of(sandbox)
        if state == "started":
            return sandbox
        if state in STARTING_STATES:
            await sandbox.wait_for_sandbox_start(timeout=startup)
            return sandbox
        log.info("deleting Daytona sandbox %s of %s in state %s", sandbox.id, key, state)
        with suppress(DaytonaNotFoundError):
            await daytona.delete(sandbox, wait=True)
        return None

    async def _create(
        self, daytona: Any, task: Task, key: str, config: RuntimeConfig, startup: float
    ) -> Any:
        from daytona import (
            CreateSandboxFromImageParams,
            CreateSandboxFromSnapshotParams,
            DaytonaConflictError,
        )

        run_timeout = config.limits.run_timeout_s or DEFAULT_RUN_TIMEOUT_S
        labels = {k: v for k, v in owner_labels(
            key, slug=task.slug, run_timeout_s=run_timeout).items() if v}
        labels[MANAGED_LABEL] = self.kind
        common: dict[str, Any] = {
            "name": container_name(key),
            "labels": labels,
            "env_vars": {"ROLLOUTS_ENV_TOKEN": substrate_token(key)},
            "ephemeral": True,
            "auto_stop_interval": 0,
            "ttl_minutes": math.ceil((run_timeout + TTL_MARGIN_S) / 60),
        }
        resources = resources_for(config.resources)
        image = config.image or (None if self.snapshot_name else self.image)
        if image:
            params: Any = CreateSandboxFromImageParams(image=image, resources=resources, **common)
        else:
            await self._ensure_snapshot(daytona, resources, startup)
            params = CreateSandboxFromSnapshotParams(snapshot=self.snapshot_name, **common)
        try:
            return await daytona.create(params, timeout=startup)
        except DaytonaConflictError:
            # A concurrent acquire of the same key created it first: use that one.
            found = await self._find(daytona, key, startup)
            if found is None:
                raise
            return found

    async def _ensure_snapshot(self, daytona: Any, resources: Any, startup: float) -> None:
        """Build ``snapshot_name`` from ``image`` when missing; check its resources otherwise."""
        from daytona import CreateSnapshotParams, DaytonaConflictError

        name = str(self.snapshot_name)
        async with self._snapshot_lock:
            snapshot = await snapshot_ready(daytona, name, startup)
            if snapshot is None:
                if self.image is None:
                    raise ConfigError(
                        f"Daytona snapshot {name!r} not found; pass DaytonaRuntime(image=...) "
                        "to build it"
                    )
                log.info("building Daytona snapshot %s from %s", name, self.image)
                with suppress(DaytonaConflictError):  # another process is building it
                    await daytona.snapshot.create(
                        CreateSnapshotParams(name=name, image=self.image, resources=resources),
                        timeout=startup,
                    )
                await snapshot_ready(daytona, name, startup)
                return
        if resources is not None:
            wanted = {"cpu": resources.cpu, "mem": resources.memory, "gpu": resources.gpu}
            have = {k: getattr(snapshot, k, None) for k in wanted}
            differ = {k: v for k, v in wanted.items() if v is not None and have[k] != v}
            if differ:
                raise ConfigError(
                    f"Daytona snapshot {name!r} was built with {have}, the task asks for "
                    f"{differ}: a snapshot's resources are fixed when it is built (boot an "
                    "image with runtime_config.image, or use another snapshot name)"
                )

    async def _start_server(self, sandbox: Any) -> str:
        """The id of the session command serving the env: the running one, else a new one."""
        from daytona import DaytonaNotFoundError, SessionExecuteRequest

        try:
            session = await sandbox.process.get_session(SESSION)
        except DaytonaNotFoundError:
            await sandbox.process.create_session(SESSION)
        else:
            running = [c for c in session.commands or [] if c.exit_code is None]
            if running:
                return str(running[-1].id)
        response = await sandbox.process.execute_session_command(
            SESSION, SessionExecuteRequest(command=self._serve_command(), run_async=True)
        )
        return str(response.cmd_id)

    async def _logs(self, sandbox: Any, cmd_id: str) -> str:
        try:
            logs = await sandbox.process.get_session_command_logs(SESSION, cmd_id)
        except Exception as exc:  # noqa: BLE001 - the logs only explain another failure
            return f"(logs unavailable: {exc})"
        return "\n".join(str(logs.output or logs.stdout or "").splitlines()[-LOG_TAIL_LINES:])

    async def _exited(self, sandbox: Any, cmd_id: str) -> str | None:
        """A message with the last log lines once the server command exited, else None."""
        command = await sandbox.process.get_session_command(SESSION, cmd_id)
        if command.exit_code is None:
            return None
        return (
            f"env server in Daytona sandbox {sandbox.id} exited with code {command.exit_code}; "
            f"last {LOG_TAIL_LINES} log lines:\n{await self._logs(sandbox, cmd_id) or '(none)'}"
        )

    async def _announced_port(self, sandbox: Any, cmd_id: str, timeout: float) -> int:
        """Wait for ``ROLLOUTS_SERVE_PORT=`` in the command's output (or its exit)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            logs = await sandbox.process.get_session_command_logs(SESSION, cmd_id)
            for line in str(logs.stdout or logs.output or "").splitlines():
                if line.startswith(SERVE_PORT_ANNOUNCEMENT):
                    return int(line[len(SERVE_PORT_ANNOUNCEMENT):].strip())
            exited = await self._exited(sandbox, cmd_id)
            if exited is not None:
                raise ProviderError(exited)
            if asyncio.get_running_loop().time() > deadline:
                raise ReadyTimeoutError(
                    f"env server in Daytona sandbox {sandbox.id} did not announce its port "
                    f"within {timeout:g}s; last log lines:\n"
                    f"{await self._logs(sandbox, cmd_id) or '(none)'}"
                )
            await asyncio.sleep(_POLL_S)

    async def _forward(self, sandbox: Any, key: str, remote_port: int) -> str:
        """Forward a loopback port here to ``remote_port`` in the sandbox; its ``tcp://`` url."""
        import asyncssh

        access = await sandbox.create_ssh_access(expires_in_minutes=self.ssh_expires_minutes)
        host, port = self._ssh_address()
        known_hosts = settings().daytona_known_hosts
        known_hosts = str(known_hosts) if known_hosts is not None else None
        logging.getLogger("asyncssh").addFilter(_REDACT)  # idempotent
        _REDACT.tokens.add(access.token)
        try:
            conn = await asyncssh.connect(
                host, port, username=access.token, known_hosts=known_hosts, client_keys=[],
                agent_path=None, keepalive_interval=_SSH_KEEPALIVE_S,
            )
        except (asyncssh.PermissionDenied, asyncssh.HostKeyNotVerifiable) as exc:
            _REDACT.tokens.discard(access.token)
            raise ConfigError(f"Daytona SSH gateway {self.ssh_host} refused: {exc}") from exc
        except (OSError, asyncssh.Error) as exc:
            _REDACT.tokens.discard(access.token)
            raise ProviderError(f"cannot reach Daytona SSH gateway {self.ssh_host}: {exc}") from exc
        try:
            listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", remote_port)
        except BaseException:
            conn.close()
            _REDACT.tokens.discard(access.token)
            raise
        _close_forward(key)
        _FORWARDS[key] = _Forward(conn, listener, access.token)
        return f"tcp://127.0.0.1:{listener.get_port()}"

    async def release(self, endpoint: Endpoint) -> None:
        """Close the forward and delete the sandbox (a no-op when it is already gone)."""
        from daytona import DaytonaNotFoundError

        _close_forward(endpoint.key)
        async with daytona_client("DaytonaRuntime") as daytona:
            target = endpoint.handle.get("sandbox_id") or container_name(endpoint.key)
            try:
                sandbox = await daytona.get(str(target))
                await daytona.delete(sandbox)
            except DaytonaNotFoundError:
                return

    # -- gc: the labelled sandboxes of this Daytona organisation ------------------------------

    @classmethod
    def list_substrates(cls) -> list[Substrate]:
        """Every sandbox labelled by this provider ([] when Daytona is not configured)."""
        return list_sandboxes(cls.kind)

    @classmethod
    async def reap(cls, substrate: Substrate, confirm: Callable[[], Awaitable[bool]]) -> bool:
        """Delete the sandbox once ``confirm()`` agrees (a gone one counts as removed)."""
        if not await confirm():
            return False
        await sandbox_by_id(str(substrate.handle["sandbox_id"]), delete=True)
        return True


def _close_forward(key: str) -> None:
    fwd = _FORWARDS.pop(key, None)
    if fwd is not None:
        fwd.close()
