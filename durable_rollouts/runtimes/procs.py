"""Env server processes on this host: a process's identity (pid plus start time, so a reused pid
is never mistaken for it), whether it is still an env server, whether its spawner is gone, and the
``state.json`` a placed process is recorded in. Used by the subprocess provider (which also reaps
its own orphans). Liveness and signals are ``durable_rollouts.processes``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..paths import atomic_write
from ..processes import pid_alive

__all__ = [
    "is_env_server",
    "read_state",
    "spawner_gone",
    "start_time",
    "write_state",
]

ENV_SERVER_MARK = b"durable_rollouts.envserver"  # in the argv of every env server process


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None without one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """The process start time (clock ticks since boot): with the pid, a unique identity."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def is_env_server(pid: int, born: str | None = None) -> bool:
    """True when ``pid`` is a running env server, the one born at ``born`` if given."""
    if not pid_alive(pid):
        return False
    fields = _stat(pid)
    if fields is None:
        return True  # no procfs: trust kill(0)
    if born and len(fields) > 19 and fields[19] != born:
        return False
    try:
        return ENV_SERVER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def spawner_gone(pid: int) -> bool:
    """True when the Python process that spawned env server ``pid`` has exited: the child was
    re-parented to init or a subreaper (not a Python process). False when it cannot tell."""
    fields = _stat(pid)
    if fields is None or len(fields) < 2:
        return False
    ppid = int(fields[1])
    if ppid <= 1:
        return True
    try:
        argv0 = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return not pid_alive(ppid)
    return b"python" not in os.path.basename(argv0)


def read_state(directory: Path) -> dict[str, Any] | None:
    """``directory/state.json`` (None when missing, unreadable or without an integer pid)."""
    try:
        state = json.loads((directory / "state.json").read_text())
        int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def write_state(directory: Path, state: dict[str, Any]) -> None:
    """Replace ``directory/state.json`` atomically."""
    atomic_write(directory / "state.json", json.dumps(state).encode())
