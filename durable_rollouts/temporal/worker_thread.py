"""The in-process ("embedded") worker on its own thread and event loop.

A worker sharing the caller's event loop dies with it: when ``asyncio.run`` returns it cancels
every task at once, including temporalio's poll loops and activation handlers, and with a data
converter that does async work per activation (external storage, a payload codec) the worker's
shutdown then waits forever for activations nobody completes. On its own loop the worker is
untouched by the caller's teardown; it is shut down gracefully by ``shutdown()`` or at exit.
The thread's worker has its own client (same address and namespace as the caller's).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

__all__ = ["ThreadedWorker"]

_LIVE: set[ThreadedWorker] = set()


class ThreadedWorker:
    """``worker.build_worker`` on a daemon thread; ``start()`` returns once it polls."""

    def __init__(self, address: str, namespace: str, task_queue: str) -> None:
        self.address, self.namespace, self.task_queue = address, namespace, task_queue
        self._loop = asyncio.new_event_loop()
        self._worker: Any = None
        self._done: Future[None] = Future()
        self._thread = threading.Thread(target=self._main, name=f"rollouts-worker-{task_queue}",
                                        daemon=True)

    async def start(self) -> None:
        ready: Future[None] = Future()
        self._ready = ready
        self._thread.start()
        await asyncio.wrap_future(ready)
        _LIVE.add(self)

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._done.done()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._run())
        except BaseException as err:  # noqa: BLE001 - reported to start()/shutdown()
            if not self._ready.done():
                self._ready.set_exception(err)
        finally:
            if not self._done.done():
                self._done.set_result(None)
            with contextlib.suppress(Exception):
                self._loop.close()

    async def _run(self) -> None:
        from durable_rollouts.sdk.temporal import connect_client
        from durable_rollouts.worker import build_worker

        client = await connect_client(self.address, namespace=self.namespace)
        self._worker = build_worker(client, task_queue=self.task_queue)
        task = asyncio.ensure_future(self._worker.run())
        await asyncio.sleep(0)
        self._ready.set_result(None)
        await task

    async def shutdown(self) -> None:
        """Stop polling, finish what runs (graceful timeout), and end the thread."""
        _LIVE.discard(self)
        if self._worker is not None and self._thread.is_alive():
            with contextlib.suppress(Exception):
                stop = asyncio.run_coroutine_threadsafe(self._worker.shutdown(), self._loop)
                await asyncio.wrap_future(stop)
        with contextlib.suppress(Exception):
            await asyncio.wrap_future(self._done)

    def shutdown_blocking(self, timeout: float = 15.0) -> None:
        _LIVE.discard(self)
        if self._worker is not None and self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._worker.shutdown(), self._loop).result(timeout)
        self._thread.join(timeout)


@atexit.register
def _shutdown_all() -> None:
    for worker in list(_LIVE):
        worker.shutdown_blocking()
