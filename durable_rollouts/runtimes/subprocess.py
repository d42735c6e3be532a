"""``SubprocessRuntime``: serve the environment from a child process that outlives its parent.

The child (``python -m durable_rollouts.envserver PATH``) gets its own session, so a crashed
worker does not take it down, and writes its output to a log file (a pipe would die with the
parent). State lives under ``$ROLLOUTS_HOME/substrates/<key>/``: ``env.log`` and ``state.json``
(pid, pgid, port), so any process on this host can find, reuse or remove the substrate of a key.
Task data never travels by argv or environment: it goes over the socket in ``tasks.start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ConfigError, ProviderError, ReadyTimeoutError
from ..locks import file_lock
from ..models import Endpoint, ProviderSpec, Task
from ..paths import rollouts_home, safe_name
from ..processes import pid_alive, signal_process, stop_process_async
from ..protocol import SERVE_PORT_ANNOUNCEMENT
from .base import DurableProvider, Locality, Substrate, log_tail
from .labels import LABEL_HOST, LABEL_KEY, LABEL_WORKFLOW, workflow_for_key
from .procs import is_env_server, read_state, spawner_gone, start_time, write_state

__all__ = ["SubprocessRuntime", "substrate_dir", "substrates_root"]

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # our own children, reaped on release


REAP_LOCK_WAIT_S = 5.0  # a substrate locked longer than this is busy: gc skips it this time


def substrates_root() -> Path:
    """Where each live child keeps ``<safe key>/state.json`` (and its log)."""
    return rollouts_home() / "substrates"


def substrate_dir(key: str) -> Path:
    """The state directory of the substrate placed under ``key``."""
    return substrates_root() / safe_name(key)


class SubprocessRuntime(DurableProvider):
    """Serve each rollout's environment from its own child process on this host.

    Args:
        path: the ``env.py`` for rows whose ``source`` names no existing file (a row made by
            calling a template carries the path of its env file, so a verifier env defined
            in another file is served from there).
        env_name: which environment of the file (default: the task's ``env``).
        ready_timeout: seconds to wait for the port announcement (``limits.startup_timeout_s``
            of a task overrides it).
        python: the interpreter that runs the server.
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "subprocess"
    locality: ClassVar[Locality] = "host"
    honours: ClassVar[frozenset[str]] = frozenset({"limits.startup_timeout_s"})

    def __init__(self, path: str | Path | None = None, *, env_name: str | None = None,
                 ready_timeout: float = 60.0, python: str = sys.executable,
                 max_provisions_per_s: float | None = None, max_substrates: int | None = None) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.path = str(Path(path).resolve()) if path is not None else None
        self.env_name = env_name
        self.ready_timeout = ready_timeout
        self.python = python

    def __repr__(self) -> str:
        return f"SubprocessRuntime({self.path!r})"

    def spec(self) -> ProviderSpec:
        return ProviderSpec(kind=self.kind, options={
            "path": self.path, "env_name": self.env_name,
            "ready_timeout": self.ready_timeout, "python": self.python,
        })

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SubprocessRuntime:
        return cls(options.get("path"), env_name=options.get("env_name"),
                   ready_timeout=float(options.get("ready_timeout") or 60.0),
                   python=options.get("python") or sys.executable)

    # -- lifecycle ------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        self.check_config(task.runtime_config, what=f"task {task.slug}")
        source = _source_for(task, self.path)
        if not source or not Path(source).is_file():
            raise ConfigError(f"SubprocessRuntime needs an env file; got {source!r} for task {task.slug}")
        directory = substrate_dir(key)
        directory.mkdir(parents=True, exist_ok=True)
        async with file_lock(directory / "lock"):
            state = read_state(directory)
            if state and state.get("port") and _alive(int(state["pid"]), state.get("birth")):
                return self._endpoint(task, key, state)
            if state:  # a dead or half-started substrate: make sure it is gone, then replace it
                await _stop_group(int(state["pid"]), int(state.get("pgid", state["pid"])), state.get("birth"))
            state = await self._spawn(task, source, directory)
            return self._endpoint(task, key, state)

    async def release(self, endpoint: Endpoint) -> None:
        directory = substrate_dir(endpoint.key)
        if not directory.exists() and not endpoint.handle:
            return
        directory.mkdir(parents=True, exist_ok=True)
        async with file_lock(directory / "lock"):
            state = read_state(directory) or {}
            for source in (state, endpoint.handle):
                if source.get("pid"):
                    pid = int(source["pid"])
                    await _stop_group(pid, int(source.get("pgid") or pid), source.get("birth"))
            # The log goes too: a failed start keeps it (its path is in the error message).
            shutil.rmtree(directory, ignore_errors=True)

    # -- gc -------------------------------------------------------------------------------

    @classmethod
    def list_substrates(cls) -> list[Substrate]:
        """The env servers recorded under ``$ROLLOUTS_HOME/substrates``. Their state has no
        labels: the key is the directory name (``safe_name(key)``, equal to the key for the ids
        this package makes) and the workflow id is derived from it."""
        out = []
        root = substrates_root()
        for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
            state = read_state(path.parent)
            if state is None:
                continue
            pid, key = int(state["pid"]), path.parent.name
            labels = {LABEL_KEY: key, LABEL_WORKFLOW: workflow_for_key(key),
                      LABEL_HOST: socket.gethostname()}
            alive = is_env_server(pid, state.get("birth"))
            handle = {"pid": pid, "pgid": int(state.get("pgid") or pid), "dir": str(path.parent),
                      "birth": state.get("birth")}
            out.append(Substrate(cls.kind, labels, handle, alive=alive,
                                 owner_gone=not alive or spawner_gone(pid),
                                 dead="" if alive else "process already dead"))
        return out

    @classmethod
    async def reap(cls, substrate: Substrate, confirm: Callable[[], Awaitable[bool]]) -> bool:
        """Kill the env server's group and remove its directory, under the substrate's lock,
        if it was not replaced meanwhile and ``confirm()`` agrees; a lock held longer than
        ``REAP_LOCK_WAIT_S`` means the provider is busy with it (skipped this time)."""
        directory = Path(substrate.handle["dir"])
        pid = int(substrate.handle["pid"])
        try:
            async with file_lock(directory / "lock", timeout=REAP_LOCK_WAIT_S) as held:
                state = read_state(directory)
                if not held or state is None or int(state["pid"]) != pid or not await confirm():
                    return False
                if is_env_server(pid, substrate.handle.get("birth")):
                    signal_process(pid, pgid=int(substrate.handle.get("pgid") or pid))
                shutil.rmtree(directory, ignore_errors=True)
                return True
        except OSError:  # the directory is gone: nothing left to reap
            return False

    # -- helpers --------------------------------------------------------------------------

    def _endpoint(self, task: Task, key: str, state: dict[str, Any]) -> Endpoint:
        return Endpoint(
            url=f"tcp://127.0.0.1:{state['port']}", params={}, config=task.runtime_config,
            provider=self.spec(), key=key,
            handle={"pid": state["pid"], "pgid": state["pgid"], "log": state["log"],
                    "birth": state.get("birth")},
        )

    async def _spawn(self, task: Task, source: str, directory: Path) -> dict[str, Any]:
        log = directory / "env.log"
        cmd = [self.python, "-m", "durable_rollouts.envserver", source,
               "--env", self.env_name or task.env]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log, "wb") as out:
            proc = subprocess.Popen(  # noqa: S603 - argv holds no task data, only the env file
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=str(Path(source).parent), env=env, start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        # Recorded before it is ready, so a release by key finds even a half-started server.
        birth = start_time(proc.pid)
        write_state(directory, {"pid": proc.pid, "pgid": proc.pid, "port": None, "log": str(log),
                                 "birth": birth})
        limits = task.runtime_config.limits if task.runtime_config is not None else None
        timeout = limits.startup_timeout_s if limits and limits.startup_timeout_s else self.ready_timeout
        try:
            port = await _wait_for_port(proc, log, timeout, task.env)
        except BaseException:  # early exit, timeout or cancellation: never leave it behind
            await asyncio.shield(_stop_group(proc.pid, proc.pid, birth))
            with contextlib.suppress(OSError):
                (directory / "state.json").unlink()
            raise
        state = {"pid": proc.pid, "pgid": proc.pid, "port": port, "log": str(log), "birth": birth,
                 "source": source, "started_at": time.time()}
        write_state(directory, state)
        return state


async def _wait_for_port(proc: subprocess.Popen[bytes], log: Path, timeout: float, env: str) -> int:
    deadline = time.monotonic() + timeout
    while True:
        port = _announced_port(log)
        if port is not None:
            return port
        code = proc.poll()
        if code is not None:
            raise ProviderError(
                f"environment server for {env!r} exited with code {code} before it was ready; "
                f"last 50 lines of its output ({log}):\n{log_tail(log, 50)}"
            )
        if time.monotonic() > deadline:
            raise ReadyTimeoutError(
                f"environment server for {env!r} did not announce its port within {timeout}s; "
                f"last 50 lines of its output ({log}):\n{log_tail(log, 50)}"
            )
        await asyncio.sleep(0.02)


def _source_for(task: Task, default: str | None) -> str | None:
    if task.source and task.source.endswith(".py") and Path(task.source).is_file():
        return str(Path(task.source).resolve())
    return default


def _announced_port(log: Path) -> int | None:
    try:
        text = log.read_bytes()[:1_000_000].decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(SERVE_PORT_ANNOUNCEMENT):
            value = line[len(SERVE_PORT_ANNOUNCEMENT):].strip()
            if value.isdigit():
                return int(value)
    return None


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a dying process still counts)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    return pid_alive(pid)


def _alive(pid: int, born: str | None = None) -> bool:
    """True when ``pid`` is a running env server, the one born at ``born`` if given."""
    return _running(pid) and is_env_server(pid, born)


async def _stop_group(pid: int, pgid: int, birth: str | None = None, grace: float = 3.0) -> None:
    """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL; reap our own child."""
    if _alive(pid, birth):  # identity checked once, before any signal
        # The group's stragglers (children the env spawned) are killed too: the leader was ours
        # just now, so this group id still belongs to it.
        await stop_process_async(pid, pgid=pgid, grace_s=grace, alive=_running)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(child.wait, 5)
