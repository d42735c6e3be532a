"""Advisory file locks across processes, polled so the event loop keeps running.

The one lock helper: the subprocess provider holds ``<substrate>/lock`` while it places or removes
a substrate, and its orphan reaping takes the same lock with a timeout (busy = skip this time).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["file_lock"]

POLL_S = 0.02


@contextlib.asynccontextmanager
async def file_lock(path: Path, timeout: float | None = None) -> AsyncIterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); yields True once held, or
    False when ``timeout`` seconds passed first (None: wait as long as it takes).

    Raises:
        OSError: ``path`` cannot be opened (e.g. its directory is gone).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    yield False
                    return
                await asyncio.sleep(POLL_S)
        yield True
    finally:
        os.close(fd)  # closing releases the lock
