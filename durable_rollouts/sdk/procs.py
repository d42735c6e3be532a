"""Process helpers shared by the subprocess provider, the embedded server and gc: liveness and
the ``state.json`` a placed process is recorded in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .paths import atomic_write

__all__ = ["pid_alive", "read_state", "write_state"]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (exited but not yet reaped counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


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
