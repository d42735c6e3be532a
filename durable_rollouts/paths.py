"""Where durable_rollouts keeps local state (traces, substrate logs, pid files).

``$ROLLOUTS_HOME`` (default ``~/.local/share/durable-rollouts``) is read on every call, so tests
and child processes that set it see their own directory. Imports only the standard library and
``durable_rollouts.settings``.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .settings import settings

__all__ = ["atomic_write", "rollouts_home", "safe_name"]


def rollouts_home() -> Path:
    """The state directory (``$ROLLOUTS_HOME`` or ``~/.local/share/durable-rollouts``)."""
    home = settings().home
    return home.expanduser() if home else Path.home() / ".local" / "share" / "durable-rollouts"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(key: str) -> str:
    """A filesystem-safe version of ``key`` (rollout ids may carry any character)."""
    cleaned = _UNSAFE.sub("_", key).strip("._") or "_"
    return cleaned[:200]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: readers see the old or the new file, never a
    part; a failed write (a full disk) leaves no temporary file behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
