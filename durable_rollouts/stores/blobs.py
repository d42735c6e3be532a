"""Where claim checks (traces, result chunks, rows) are stored: a small registry, so everything
below the Temporal layer stays Temporal-free.

The durable path's store is ``durable_rollouts.temporal.storage.Blobs`` (the ``ROLLOUTS_STORAGE``
driver, shared by every host): importing that module registers it here, and it is always loaded
before a durable step runs (the data converter of every client and worker builds on it). Without
it (the direct executor in a process that never touched Temporal), blobs are local files under
``$ROLLOUTS_HOME/traces`` with ``file://`` URIs, which every reader still understands.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..paths import atomic_write, rollouts_home

__all__ = ["BlobStore", "LocalBlobs", "default_blobs", "register_blobs"]


class BlobStore(Protocol):
    """Stores bytes and names them by a URI."""

    def put(self, data: bytes) -> str: ...

    async def aput(self, data: bytes) -> str: ...

    def get(self, uri: str) -> bytes: ...


class LocalBlobs:
    """Content-addressed files under ``root`` (default ``$ROLLOUTS_HOME/traces``), ``file://`` URIs."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else rollouts_home() / "traces"

    def put(self, data: bytes) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        path = (self.root / f"{hashlib.sha256(data).hexdigest()}.json").resolve()
        atomic_write(path, data)
        return path.as_uri()

    async def aput(self, data: bytes) -> str:
        return await asyncio.to_thread(self.put, data)

    def get(self, uri: str) -> bytes:
        return Path(uri.removeprefix("file://")).read_bytes()


_FACTORY: Callable[[], BlobStore] | None = None


def register_blobs(factory: Callable[[], BlobStore]) -> None:
    """Make ``factory`` the source of the default store (``temporal.storage`` calls this)."""
    global _FACTORY
    _FACTORY = factory


def default_blobs() -> BlobStore:
    """The registered store, else local files."""
    return _FACTORY() if _FACTORY is not None else LocalBlobs()
