"""In-process workers hold what their batches ask for (``sdk.lifetime.lease_wide``). temporalio
allows one worker per queue in a process, so: a batch joins the running worker while its slots
hold every leased batch's width; an idle worker too narrow for the next batch (in a
``session()``) is replaced by a wider one; one that other batches still use stays, with one
``CapacityWarning`` naming the knob, never a silent cap."""

from __future__ import annotations

import asyncio

import pytest

from durable_rollouts.capacity import CapacityWarning
from durable_rollouts.sdk import lifetime


class FakeWorker:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.stop.wait()

    async def shutdown(self) -> None:
        self.stop.set()


def _builder(built: list[FakeWorker], slots: int):
    def make() -> FakeWorker:
        built.append(FakeWorker(slots))
        return built[-1]
    return make


async def test_batches_share_the_worker_while_its_slots_hold_their_widths() -> None:
    built: list[FakeWorker] = []
    async with lifetime.session():
        a = await lifetime.lease_wide("q", 1000, _builder(built, 1500))
        b = await lifetime.lease_wide("q", 400, _builder(built, 500))  # 1000 + 400 fit in 1500
        queries = await lifetime.lease_wide("q", 0, _builder(built, 500))
        assert a.worker is b.worker is queries.worker and len(built) == 1
        for lease in (a, b, queries):
            await lease.release()
    assert built[0].stop.is_set()


async def test_an_idle_worker_too_narrow_for_the_next_batch_is_replaced_by_a_wider_one() -> None:
    built: list[FakeWorker] = []
    async with lifetime.session():
        narrow = await lifetime.lease_wide("q", 16, _builder(built, 500))
        await narrow.release()  # the session keeps it running, idle
        wide = await lifetime.lease_wide("q", 2000, _builder(built, 2500))
        assert len(built) == 2 and built[0].stop.is_set() and wide.worker is built[1]
        await wide.release()


async def test_a_busy_worker_too_narrow_for_another_batch_warns_once_naming_the_knob() -> None:
    built: list[FakeWorker] = []
    async with lifetime.session():
        running = await lifetime.lease_wide("q", 400, _builder(built, 500))
        with pytest.warns(CapacityWarning, match=r"reaches at most 100 of its max_concurrent=2000") as caught:
            wider = await lifetime.lease_wide("q", 2000, _builder(built, 2500))
        assert len(caught) == 1 and "--max-concurrent" in str(caught[0].message)
        assert wider.worker is running.worker and len(built) == 1  # one worker per queue
        await wider.release()
        await running.release()
