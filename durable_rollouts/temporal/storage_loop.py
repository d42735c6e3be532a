"""One background event loop per process for storage I/O (a daemon thread).

The S3/GCS clients and ``storage.Blobs`` submit their coroutines here, so sync and async callers
on any thread or loop share one client and one connection pool. Imports only the standard library.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LOOP"]

_T = TypeVar("_T")




class _Loop:
    """A daemon thread running an event loop; coroutines submitted from any thread or loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="rollouts-storage",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the background loop and wait for it (from sync code)."""
        return asyncio.run_coroutine_threadsafe(coro, self._get()).result()

    async def arun(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await ``coro`` on the background loop (from any other loop)."""
        loop = self._get()
        try:
            if asyncio.get_running_loop() is loop:
                return await coro
        except RuntimeError:
            pass
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


LOOP = _Loop()
