"""In-process workers hold what their batches ask for (``sdk.lifetime.lease_wide``): a batch
joins a running worker only while its slots hold every leased batch's width, else another
worker starts on the same key; giving a lease back frees its width."""

from __future__ import annotations

import asyncio

from durable_rollouts.sdk import lifetime


class FakeWorker:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.stop.wait()

    async def shutdown(self) -> None:
        self.stop.set()


async def test_a_batch_wider_than_the_running_workers_free_slots_gets_a_worker_of_its_own() -> None:
    built: list[FakeWorker] = []

    def build(slots: int):
        def make() -> FakeWorker:
            built.append(FakeWorker(slots))
            return built[-1]
        return make

    async with lifetime.session():
        a = await lifetime.lease_wide("q", 1000, build(1500))
        b = await lifetime.lease_wide("q", 400, build(500))  # 1000 + 400 fit in 1500
        assert a.worker is b.worker and len(built) == 1
        c = await lifetime.lease_wide("q", 1000, build(1500))  # 2400 would not: a second worker
        assert c.worker is not a.worker and len(built) == 2 and c.worker.slots == 1500
        await b.release()
        d = await lifetime.lease_wide("q", 450, build(500))  # b's width was given back
        assert d.worker is a.worker and len(built) == 2
        queries = await lifetime.lease_wide("q", 0, build(500))  # no width: the first worker
        assert queries.worker is a.worker
        for lease in (a, c, d, queries):
            await lease.release()
    assert all(w.stop.is_set() for w in built)
