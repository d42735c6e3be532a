"""A trainer process for the outage cells: attach to a streamed job, apply each batch, ack it.

``python outage_trainer.py ADDRESS JOB_ID LOG``: every received batch is *applied* (one JSON line
``{"pid", "batch", "groups", "event": "apply"}`` appended and fsynced to LOG) and then
acknowledged (an ``"ack"`` line). A naive trainer: it applies on receipt, so a batch delivered
again after a lost acknowledgement would be applied twice (the cells count that). Errors from a
store or a Temporal server that is away (an outage) are logged as ``"error"`` lines and the
trainer attaches again after a second, as a real training loop would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os


def _log(path: str, **line: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), **line}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.sdk.job import Job
    from durable_rollouts.temporal.connection import connect_client

    while True:
        try:
            client = await connect_client(args.address)
            job = await Job.attach(args.job_id, temporal=client, worker=False)
            async for batch in job.stream(consumer="trainer", batch_size=1):
                _log(args.log, event="apply", batch=batch.id, groups=[r.group_id for r in batch.records])
                await batch.ack()
                _log(args.log, event="ack", batch=batch.id)
            break
        except Exception as exc:  # an outage: attach again, as a training loop would
            _log(args.log, event="error", error=f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(1.0)
    print("DONE", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("job_id")
    parser.add_argument("log")
    asyncio.run(main(parser.parse_args()))
