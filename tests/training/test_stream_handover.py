"""A query that reaches a run as it continues as new is refused, and the next run is asked.

Found in ``bench_stream.py --long``: a consumer's ``stream_view`` query that reached the batch's
run while it continued as new was answered by the worker replaying that closed run's whole
history (5-6 s at 5,700 events), and the consumer waited that long. The query now asks for an
open run (``QueryRejectCondition.NOT_OPEN``). Real dev server, real envs: the race is played by a
job whose first query goes to a run that has already continued as new.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent
from temporalio.client import WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.live import LiveJob
from durable_rollouts.temporal.open_run import HandedOver, query_open
from durable_rollouts.temporal.parts import batch_progress
from durable_rollouts.workflows import TasksetRun, workflow_id
from durable_rollouts.workflows.stream import StreamRequest


class _Racing(LiveJob):
    """Its first call reaches the run ``first`` (closed by continue-as-new); then the latest run."""

    first: str
    targets: list[str]

    @property
    def _workflow(self):  # type: ignore[no-untyped-def, override]
        run = self.first if not self.targets else None
        self.targets.append(run or "latest")
        return self.client.get_workflow_handle(workflow_id(self.id), run_id=run)


async def test_a_query_reaching_a_run_as_it_continues_as_new_asks_the_next_run(
        client, task_queue, tmp_path: Path) -> None:
    rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": f"row{i}"})
            for i in range(8)]
    job = await Taskset("handover", rows).start(
        CountingAgent(answer="x", seconds=0.1), runtime=LocalRuntime(ENV_FILE), temporal=client,
        worker=True, task_queue=task_queue, consumers=["trainer"], max_concurrent=2,
        max_history_events=40, linger_s=120)
    wid = workflow_id(job.id)
    for _ in range(300):  # until the batch has continued as new at least once
        runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{wid}'")]
        if len(runs) >= 2:
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("the batch never continued as new")
    first = min(runs, key=lambda wf: wf.start_time).run_id
    request = StreamRequest(consumer="trainer", start=0, limit=8)

    # the server refuses a query for an open run at a run that has continued as new
    with pytest.raises(WorkflowQueryRejectedError):
        await client.get_workflow_handle(wid, run_id=first).query(
            TasksetRun.stream_view, request, reject_condition=QueryRejectCondition.NOT_OPEN)

    racing = object.__new__(_Racing)
    racing.__dict__.update(job.__dict__)
    racing.first, racing.targets = first, []
    view = await racing.view("trainer", 0, 8)
    assert racing.targets == [first, "latest"]  # refused, the job still runs: asked again
    assert view.base == 0 and view.delivered >= 1

    # the progress query (`rollouts show`, the CLI's bars) asks the open run the same way
    with pytest.raises(HandedOver):
        await query_open(client.get_workflow_handle(wid, run_id=first), TasksetRun.progress)
    progress = await batch_progress(client.get_workflow_handle(wid))
    assert progress.total == 8 and progress.started >= 1

    seen: list[str] = []
    async for batch in job.stream(consumer="trainer", batch_size=4):
        seen.extend(r.group_id for r in batch.records)
        await batch.ack()
    assert len(seen) == len(set(seen)) == 8
    await asyncio.wait_for(job.wait(), 60)
