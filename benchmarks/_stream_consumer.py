"""The ``--long`` consumer of ``bench_stream.py``, in its own process as a trainer would run.

``python _stream_consumer.py ADDRESS JOB_ID CONSUMER BATCH_SIZE [pipelined]``: attach, stream,
ack every batch (``pipelined``: ``ack(wait=False)``, one ack in flight, the rest sent together
when it lands); prints one JSON line at the end: groups, acks, delivery lags (a group's last
member ended -> the consumer has it), batch lags (a batch's last group ended -> the consumer has
the batch: the lag without the wait for a batch to fill) and ack latencies, in seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def main(address: str, job_id: str, consumer: str, batch_size: int, pipelined: bool) -> None:
    from durable_rollouts.sdk.job import Job
    from durable_rollouts.temporal.connection import connect_client

    job = await Job.attach(job_id, temporal=await connect_client(address), worker=False)
    lags: list[float] = []
    batch_lags: list[float] = []
    acks: list[float] = []
    groups = 0
    async for batch in job.stream(consumer=consumer, batch_size=batch_size):
        now = time.time()
        ended = [now - max(r.ended_at or now for r in rec.results) for rec in batch.records]
        lags += ended
        batch_lags.append(min(ended, default=0.0))
        t0 = time.perf_counter()
        await batch.ack(wait=not pipelined)
        acks.append(time.perf_counter() - t0)
        groups += len(batch.records)
    print(json.dumps({"groups": groups, "lags": lags, "batch_lags": batch_lags, "acks": acks}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                     sys.argv[5:6] == ["pipelined"]))
