"""A trainer on the current release reads a stream whose batch runs on the previous release's
worker. That worker's batch workflow has no ``stream_wait`` update (the batch waking a caught-up
consumer): the current reader finds that out from the refusal and polls instead, and reads every
group once. A release from before the update (``BEFORE_WAKE``, pinned: ``PREVIOUS_RELEASE`` moves
on) is installed from this clone's history (``old_release.py``); it starts the job with its own
SDK and runs it with its own worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import old_release
import pytest
from temporal_helpers import ENV_FILE, WorkerProcess

from durable_rollouts.sdk.job import Job

pytestmark = pytest.mark.timeout(150)

ROWS = 4
BEFORE_WAKE = "c39e16230f4125151629b3d725b636c47053af47"  # a release without stream_wait
START = """
import asyncio, json, sys
from durable_rollouts.models import Task
from durable_rollouts.sdk import Taskset
from durable_rollouts.sdk.agents import SleepAgent
from durable_rollouts.sdk.providers import SubprocessRuntime

async def main():
    address, queue, env_file, rows = sys.argv[1:5]
    tasks = [Task(env="counting", id="echo", source=env_file, args={"expected": "x", "tag": f"r{i}"})
             for i in range(int(rows))]
    job = await Taskset("old-stream", tasks).start(
        SleepAgent(seconds=1.0, answer="x"), runtime=SubprocessRuntime(env_file), temporal=address,
        task_queue=queue, worker=False, max_concurrent=1, consumers=["trainer"])
    print(json.dumps({"job_id": job.id}))

asyncio.run(main())
"""


async def test_a_current_trainer_streams_a_job_the_previous_release_runs(
        dev_server, client, tmp_path: Path) -> None:
    python, _ = old_release.install(BEFORE_WAKE)
    home = python.parents[2]
    queue = f"upgrade-stream-{uuid.uuid4().hex[:8]}"
    old = WorkerProcess(dev_server.address, queue, env=old_release.old_env(home), python=str(python),
                        cwd=str(home))
    try:
        out = subprocess.run([str(python), "-c", START, dev_server.address, queue, str(ENV_FILE), str(ROWS)],
                             cwd=home, env=old_release.old_env(home), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr[-3000:]
        job_id = json.loads(out.stdout.strip().splitlines()[-1])["job_id"]
        job = await Job.attach(job_id, temporal=client, worker=False)
        seen: list[str] = []
        readers = set()

        async def read() -> None:
            async for batch in job.stream(consumer="trainer", batch_size=1, poll_s=0.2):
                seen.extend(r.group_id for r in batch.records)
                readers.add(batch.reader)
                await batch.ack()
        await asyncio.wait_for(read(), 90)  # the rows finish one at a time: the reader waited
        assert len(seen) == len(set(seen)) == ROWS
        (reader,) = readers
        assert reader._wakes is False  # the old batch refused stream_wait: the reader polled
    finally:
        old.stop()
