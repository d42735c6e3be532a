"""A trainer process for the stream tests: attach to a job, stream, log each batch, ack it.

``python stream_consumer.py ADDRESS JOB_ID CONSUMER LOG [--batch-size B] [--hang-at N]``: each
received batch is appended to LOG as one JSON line (pid, batch id, group ids, rollout ids) and
flushed to disk *before* it is acknowledged; with ``--hang-at N`` the process stops before
acknowledging its N-th batch and waits to be killed (a trainer that dies between receive and ack).
With ``--acks FILE`` each batch id is appended to FILE once its ack returned: the batches the
trainer applied (received and acknowledged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.sdk.job import Job
    from durable_rollouts.temporal.connection import connect_client

    client = await connect_client(args.address)
    job = await Job.attach(args.job_id, temporal=client, worker=False)
    received = 0
    async for batch in job.stream(consumer=args.consumer, batch_size=args.batch_size):
        received += 1
        line = {"pid": os.getpid(), "batch": batch.id, "groups": [r.group_id for r in batch.records],
                "rollouts": [run.rollout_id for group in batch.groups for run in group],
                "sizes": batch.sizes, "seqs": [r.seq for r in batch.records]}
        with open(args.log, "a") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if received == args.hang_at:
            print("HANGING", flush=True)
            await asyncio.sleep(3600)
        await batch.ack()
        if args.acks:
            with open(args.acks, "a") as fh:
                fh.write(batch.id + "\n")
    print("DONE", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("job_id")
    parser.add_argument("consumer")
    parser.add_argument("log")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--acks", default="")
    asyncio.run(main(parser.parse_args()))
