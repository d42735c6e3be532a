"""The explicit lifetime of in-process workers: leases and ``session()``.

A worker started in this process (``run_taskset``/``start_job`` against the embedded dev server)
runs only while something uses it: a batch, from ``start_job`` until its ``JobHandle.wait``
returns (or ``JobHandle.release``), or an open ``async with session():`` block. When the last
user lets go, the worker is shut down (``await worker.shutdown()``) before that call returns, so
a script's event loop ends with nothing of ours running.

Why it matters (issue #16): a temporalio Worker left to ``asyncio.run``'s final cancellation
has its pollers cancelled together with ``Worker.run``; core then waits for activations nobody
polls any more and ``finalize_shutdown`` never returns, so ``asyncio.run`` hangs for ever.
Starting a worker costs ~2 ms and stopping it ~5-15 ms, so outside a session each batch gets
its own; inside ``session()`` (a training loop) it starts once and stops at the block's end.

Temporal-free: a worker is anything with ``run()`` and ``shutdown()`` coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..capacity import CapacityWarning

__all__ = ["Lease", "lease", "lease_wide", "running", "session", "stop_all"]

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # above the workers' graceful shutdown (5 s) plus core's own clean-up


@dataclass(eq=False)
class _Slot:
    loop: asyncio.AbstractEventLoop
    key: Hashable
    worker: Any
    task: asyncio.Future[Any]
    users: int = 0
    width: int = 0  # rollouts the leases hold in flight at once (``lease_wide``)


_SLOTS: dict[tuple[int, Hashable], _Slot] = {}
_SESSIONS: dict[int, int] = {}  # id(loop) -> open session() blocks


class Lease:
    """One user's hold on an in-process worker; ``release()`` is idempotent."""

    def __init__(self, slot: _Slot, width: int = 0) -> None:
        self._slot: _Slot | None = slot
        self.width = width
        slot.users += 1
        slot.width += width

    @property
    def worker(self) -> Any:
        return self._slot.worker if self._slot is not None else None

    async def release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        slot.users -= 1
        slot.width -= self.width
        if slot.users <= 0 and not _SESSIONS.get(id(slot.loop)):
            await _stop(slot)


async def lease(key: Hashable, build: Callable[[], Any]) -> Lease:
    """A lease on the running loop's worker for ``key``, started with ``build()`` if needed."""
    loop = asyncio.get_running_loop()
    slot = _SLOTS.get((id(loop), key))
    if slot is None or slot.loop is not loop or slot.task.done():
        worker = build()
        slot = _Slot(loop=loop, key=key, worker=worker, task=asyncio.ensure_future(worker.run()))
        _SLOTS[(id(loop), key)] = slot
    return Lease(slot)


async def lease_wide(key: Hashable, width: int, build: Callable[[], Any]) -> Lease:
    """A lease for ``width`` rollouts in flight on the worker for ``key``.

    temporalio allows one worker per queue in a process, so a running worker whose slots
    (``worker.slots``) cannot hold ``width`` on top of its other leases' is replaced by a wider
    one from ``build()`` when nothing uses it (in a ``session()``, between batches); while other
    batches run on it, it stays, and one ``CapacityWarning`` says the batch will not reach its
    width and which knob fixes it: never a silent cap."""
    loop = asyncio.get_running_loop()
    slot = _SLOTS.get((id(loop), key))
    if slot is not None and slot.loop is loop and not slot.task.done():
        slots = getattr(slot.worker, "slots", 0)
        if slot.width + width > slots:
            if slot.users == 0:
                await _stop(slot)  # idle: a wider one takes its place
            else:
                warnings.warn(
                    f"the in-process worker has {slots} activity slots and its running batches "
                    f"hold {slot.width} rollouts, so this batch reaches at most "
                    f"{max(0, slots - slot.width)} of its max_concurrent={width} until they end: "
                    f"start the wider batch first, or run `rollouts worker --max-concurrent N` "
                    f"workers", CapacityWarning, stacklevel=3)
    held = await lease(key, build)
    held.width = width
    held._slot.width += width  # type: ignore[union-attr]
    return held


def running() -> list[Any]:
    """The in-process workers running on the current event loop."""
    loop = asyncio.get_running_loop()
    return [s.worker for s in _SLOTS.values() if s.loop is loop and not s.task.done()]


async def stop_all() -> None:
    """Shut down every in-process worker of the running loop, used or not."""
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(_stop(s) for s in list(_SLOTS.values()) if s.loop is loop))


@contextlib.asynccontextmanager
async def session() -> AsyncIterator[None]:
    """Keep in-process workers running across the batches of this block (a training loop pays
    their start-up once); at its end, shut down every in-process worker of this event loop."""
    loop_id = id(asyncio.get_running_loop())
    _SESSIONS[loop_id] = _SESSIONS.get(loop_id, 0) + 1
    try:
        yield
    finally:
        _SESSIONS[loop_id] -= 1
        if not _SESSIONS[loop_id]:
            del _SESSIONS[loop_id]
            await stop_all()


async def _stop(slot: _Slot) -> None:
    """Shut ``slot``'s worker down and wait for its run task (errors are logged, not raised)."""
    if _SLOTS.get((id(slot.loop), slot.key)) is slot:
        del _SLOTS[(id(slot.loop), slot.key)]

    async def stopping() -> None:
        await slot.worker.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await slot.task

    # Waited for even if our caller is cancelled: a worker stopped half-way, left to the loop's
    # final cancellation, wedges it like one never stopped.
    stopper = asyncio.ensure_future(stopping())
    try:
        await asyncio.wait({stopper}, timeout=STOP_TIMEOUT_S)
    except asyncio.CancelledError:
        await asyncio.wait({stopper}, timeout=STOP_TIMEOUT_S)
        raise
    finally:
        if not stopper.done():
            log.warning("the in-process worker did not stop within %.0f s", STOP_TIMEOUT_S)
        elif not stopper.cancelled() and stopper.exception() is not None:
            log.warning("the in-process worker stopped with an error: %s", stopper.exception())
