"""The workspace capability: a directory plus an asyncssh server whose commands run sandboxed.

``Workspace.start()`` (run from an environment's initialize hook) creates the directory, generates
per-serve ed25519 host and client keys in memory (never written to disk), binds an asyncssh server
to 127.0.0.1 and returns the ``ssh/2`` :class:`Capability` that ``hello`` publishes. The server
takes the one generated client key and allows no forwarding. Every exec'd command (or interactive
shell) runs as ``bash`` inside bubblewrap when it works, under the policy in :mod:`.sandbox`
(read-only system, only ``/workspace`` writable, private ``/tmp``, no network unless asked, the
env's own directory not visible). :mod:`.ssh_exec` runs each command and kills it past
``timeout_s`` (exit status 124).

This module holds the capability itself: choosing the isolation, the ssh server and its auth,
the :class:`Workspace` lifecycle and :func:`add_workspace`. It re-exports :class:`Mount`,
``Isolation``, ``SANDBOX_CWD``, ``TIMEOUT_EXIT_STATUS`` and :func:`bwrap_available`.

Without a working bwrap the agent's commands are refused (each one exits 126 with one line naming
``bubblewrap`` and ``isolation="none"``), the capability says ``isolation: "refused"`` and a
warning is logged once per process. They run unsandboxed in the real directory (``isolation:
"none"``) only when asked: the env's ``isolation="none"``, or the operator's
``ROLLOUTS_WORKSPACE_ISOLATION=none`` for workspaces left at ``auto``.

Imports asyncssh, ``durable_rollouts.errors``, ``durable_rollouts.settings``, ``.environment``,
``.sandbox`` and ``.ssh_exec`` only; never the server, the client or anything under ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import asyncssh

from ..errors import EnvError
from ..processes import kill_session
from ..settings import settings, var
from .capability import Capability, CapabilityHost
from .sandbox import (
    SANDBOX_CWD,
    Isolation,
    Mount,
    bwrap_argv,
    bwrap_available,
    bwrap_failure,
    command_environ,
)
from .ssh_exec import TIMEOUT_EXIT_STATUS, run_session

__all__ = [
    "SANDBOX_CWD",
    "TIMEOUT_EXIT_STATUS",
    "Isolation",
    "Mount",
    "Workspace",
    "add_workspace",
    "bwrap_available",
]

log = logging.getLogger(__name__)

_warned_no_bwrap = False
REFUSED_EXIT_STATUS = 126  # the shell's "found but cannot execute"
Granted = Literal["bwrap", "none", "refused"]


def _warn_refused(reason: str) -> None:
    global _warned_no_bwrap
    if not _warned_no_bwrap:
        _warned_no_bwrap = True
        log.warning("workspace commands are REFUSED (no sandbox; isolation 'refused'): %s", reason)


def _refusal(name: str, reason: str) -> str:
    """The one line an agent's command gets where bubblewrap cannot sandbox it."""
    return (f"workspace {name!r} refuses to run commands: bubblewrap cannot sandbox them on "
            f"this host ({reason}); to run them unsandboxed, the env passes isolation=\"none\" "
            f"to its workspace or the operator sets {var('workspace_isolation')}=none")


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
        isolation: ``auto`` (bwrap if it works, else agent commands are refused; the operator's
            ``ROLLOUTS_WORKSPACE_ISOLATION`` can say otherwise), ``bwrap`` (required: the env
            fails to start without it) or ``none`` (unsandboxed).
        host, port: where the ssh server listens (default: loopback, an ephemeral port).

    Once started, ``ws.capability`` is the published Capability; ``ws.capability("shell")``
    (HUD's form) gives it under that name.
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
        host: str = "127.0.0.1",
        port: int = 0,
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
        self.host, self.port = host, port
        self._root_arg = Path(root).resolve() if root is not None else None
        self.root: Path | None = self._root_arg
        self.isolation: Granted | None = None
        self.refusal: str | None = None  # the line refused commands get (isolation "refused")
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
            self.host,
            self.port,
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
        self.capability = Capability.ssh(
            name=self.name,
            url=f"ssh://{self.user}@{_reachable(self.host)}:{port}",
            user=self.user,
            host_pubkey=host_key.export_public_key().decode().strip(),
            client_key=client_key.export_private_key().decode(),
            cwd=self._cwd,
            shell=self.shell,
            isolation=self.isolation,
            network=self.network,
            timeout_s=self.timeout_s,
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
            kill_session(proc.pid)
        self.capability = None
        if self._temp_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self._temp_root = False

    # -- sandbox -------------------------------------------------------------------------------

    @property
    def _cwd(self) -> str:
        """Where commands start (and HOME): ``/workspace`` under bwrap, else the real root."""
        return SANDBOX_CWD if self.isolation == "bwrap" else str(self.root)

    async def _choose_isolation(self) -> Granted:
        self.refusal = None
        requested = self.requested_isolation
        if requested == "auto":
            requested = settings().workspace_isolation
        if requested == "none":
            return "none"
        for m in self.mounts:  # a typo in a mount must fail loudly, never disable the sandbox
            if not Path(m.source).exists():
                raise EnvError(f"workspace {self.name!r}: mount source {m.source} does not exist")
        reason = "bwrap is not installed"
        if bwrap_available():
            failure = await bwrap_failure(self.sandbox_argv(["true"]))
            if failure is None:
                return "bwrap"
            reason = failure
        if requested == "bwrap":
            raise EnvError(f"workspace {self.name!r} requires bwrap isolation: {reason}")
        _warn_refused(reason)
        self.refusal = _refusal(self.name, reason)
        return "refused"

    def sandbox_argv(self, command: Sequence[str], *, mounts: Iterable[Mount | str] = (),
                     env: dict[str, str] | None = None) -> list[str]:
        """The bwrap command line that runs ``command`` in this workspace's sandbox.

        ``mounts`` are added for this command only (e.g. a grader's hidden tests, read-only).
        The sandbox starts from an empty environment plus ``env`` (PATH and HOME are set).
        """
        assert self.root is not None
        return bwrap_argv(
            command,
            root=self.root,
            environ=self._environ(env or {}),
            network=self.network,
            mounts=[*self.mounts, *(Mount.parse(x) for x in mounts)],
            hide=self.hide,
        )

    def shell_command(self, command: str, *, mounts: Iterable[Mount | str] = (),
                      env: dict[str, str] | None = None) -> str:
        """A ``bash -lc``-ready string running ``command`` the way the agent's commands run.

        Graders use it to run checks against the workspace files inside the same sandbox, with
        their hidden files mounted read-only for that one command. Without bwrap it is
        ``cd ROOT && command`` (``mounts`` are then ignored: the host paths are used as they are);
        where commands are refused it raises the same refusal (an ``EnvError``).
        """
        assert self.root is not None, "the workspace has not started"
        if self.refusal is not None:
            raise EnvError(self.refusal)
        if self.isolation == "bwrap":
            return shlex.join(self._command_argv(command, env or {}, mounts=mounts))
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        return f"cd {shlex.quote(str(self.root))} && {exports}{command}"

    def _command_argv(self, command: str | None, env: dict[str, str], *,
                      mounts: Iterable[Mount | str] = ()) -> list[str]:
        shell = [self.shell, "-lc", command] if command is not None else [self.shell, "-s"]
        if self.isolation == "bwrap":
            return self.sandbox_argv(shell, mounts=mounts, env=env)
        return shell

    def _environ(self, requested: dict[str, str]) -> dict[str, str]:
        return command_environ(requested, home=self._cwd, user=self.user)

    # -- one ssh session -----------------------------------------------------------------------

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        if process.subsystem:
            process.stderr.write(f"subsystem {process.subsystem!r} is not supported\n".encode())
            process.exit(1)
            return
        if self.refusal is not None:
            process.stderr.write(f"{self.refusal}\n".encode())
            process.exit(REFUSED_EXIT_STATUS)
            return
        requested = {str(k): str(v) for k, v in dict(process.env).items()}
        await run_session(
            process,
            self._command_argv(process.command, requested),
            cwd=None if self.isolation == "bwrap" else str(self.root),
            env=self._environ(requested),
            timeout_s=self.timeout_s,
            running=self._procs,
        )


def _reachable(host: str) -> str:
    """The address a client on this host dials for a server bound to ``host``."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def add_workspace(
    env: CapabilityHost,
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
