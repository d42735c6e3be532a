"""Where durable_rollouts keeps local state (traces, substrate logs, pid files).

``$ROLLOUTS_HOME`` (default ``~/.local/share/durable-rollouts``) is read on every call, so tests
and child processes that set it see their own directory. Imports only the standard library.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["rollouts_home", "safe_name"]


def rollouts_home() -> Path:
    """The state directory (``$ROLLOUTS_HOME`` or ``~/.local/share/durable-rollouts``)."""
    raw = os.environ.get("ROLLOUTS_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".local" / "share" / "durable-rollouts"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(key: str) -> str:
    """A filesystem-safe version of ``key`` (rollout ids may carry any character)."""
    cleaned = _UNSAFE.sub("_", key).strip("._") or "_"
    return cleaned[:200]
