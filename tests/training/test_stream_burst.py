"""A streamed batch starting hundreds of rollouts at once (its first run, or a run after
continue-as-new, paced ``STARTS_PER_TASK`` per workflow task) delivers the groups that end
meanwhile, not only after its last start. Real dev server, real envs; slow lane (600 rollouts)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporal_helpers import ENV_FILE, CountingAgent
from temporalio.worker import Replayer

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id
from durable_rollouts.workflows.taskset_run import PATCH_DELIVER_WHILE_STARTING, STARTS_PER_TASK


def _rows(evidence: Path, n: int) -> Taskset:
    return Taskset("burst", [Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(evidence / "grades.log"), "tag": f"row{i}"}) for i in range(n)])


async def test_groups_that_end_during_a_burst_of_starts_are_delivered_before_it_ends(
        client, task_queue, tmp_path: Path) -> None:
    """6 x STARTS_PER_TASK rollouts start at once, paced STARTS_PER_TASK per workflow task. The
    first ones end while the later ones are still being started: the batch counts them at each
    pause (the patch marker is in its history) and their groups are delivered then. Every group
    comes once, every rollout is graded once, and the batch's history replays."""
    group, rows = 4, 6 * STARTS_PER_TASK // 4
    job = await _rows(tmp_path, rows).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                            group=group, max_concurrent=rows * group, temporal=client,
                                            worker=True, task_queue=task_queue, consumers=["trainer"])
    seen: list[str] = []
    async def read() -> None:
        async for batch in job.stream(consumer="trainer", batch_size=8):
            seen.extend(r.group_id for r in batch.records)
            await batch.ack(wait=False)
    await asyncio.wait_for(read(), 300)
    assert len(seen) == len(set(seen)) == rows
    done = await asyncio.wait_for(job.wait(), 60)
    assert len(done.runs) == rows * group
    assert len((tmp_path / "grades.log").read_text().splitlines()) == rows * group
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    markers = [e.marker_recorded_event_attributes.SerializeToString()
               for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(PATCH_DELIVER_WHILE_STARTING.encode() in m for m in markers), "no rollout was counted mid-burst"
    await Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter()).replay_workflow(history)
