"""The ``--long`` consumer of ``bench_stream.py``, in its own process as a trainer would run.

``python _stream_consumer.py ADDRESS JOB_ID CONSUMER BATCH_SIZE``: attach, stream, ack every
batch; prints one JSON line at the end: groups, acks, delivery lags (a group's last member ended
-> the consumer has it) and ack latencies, in seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def main(address: str, job_id: str, consumer: str, batch_size: int) -> None:
    from durable_rollouts.sdk.job import Job
    from durable_rollouts.temporal.connection import connect_client

    job = await Job.attach(job_id, temporal=await connect_client(address), worker=False)
    lags: list[float] = []
    acks: list[float] = []
    groups = 0
    async for batch in job.stream(consumer=consumer, batch_size=batch_size):
        now = time.time()
        lags += [now - max(r.ended_at or now for r in rec.results) for rec in batch.records]
        t0 = time.perf_counter()
        await batch.ack()
        acks.append(time.perf_counter() - t0)
        groups += len(batch.records)
    print(json.dumps({"groups": groups, "lags": lags, "acks": acks}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
