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
from temporalio.worker import Replayer

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.live import LiveJob
from durable_rollouts.temporal.open_run import HandedOver, query_open
from durable_rollouts.temporal.parts import batch_progress
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id
from durable_rollouts.workflows.stream import StreamRequest


async def _short_runs(client, task_queue: str, *, rows: int, seconds: float, width: int) -> LiveJob:  # type: ignore[no-untyped-def]
    """A streamed job for consumer "trainer" whose runs continue as new every ~40 events."""
    tasks = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": f"row{i}"})
             for i in range(rows)]
    return await Taskset("handover", tasks).start(
        CountingAgent(answer="x", seconds=seconds), runtime=LocalRuntime(ENV_FILE), temporal=client,
        worker=True, task_queue=task_queue, consumers=["trainer"], max_concurrent=width,
        max_history_events=40, linger_s=120)


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
    job = await _short_runs(client, task_queue, rows=8, seconds=0.1, width=2)
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


class _Logged(LiveJob):
    """Logs every stream_view query and what every stream_wait returned, in order."""

    calls: list[str]

    async def view(self, consumer: str, start: int, limit: int):  # type: ignore[no-untyped-def]
        self.calls.append("view")
        return await super().view(consumer, start, limit)

    async def _update(self, name: str, arg):  # type: ignore[no-untyped-def]
        result = await super()._update(name, arg)
        if name == "stream_wait":
            self.calls.append(f"wait {int(result)}")
        return result


async def test_a_consumer_woken_by_a_handover_waits_on_the_next_run_without_a_query(
        client, task_queue) -> None:
    """A run continuing as new wakes its waiting consumers with ``-1 - delivered``; the consumer
    then waits again (on the next run) and asks no ``stream_view`` of the closing run, which
    would be answered by replaying it once it closed. Every group still arrives once."""
    job = await _short_runs(client, task_queue, rows=12, seconds=0.3, width=1)
    logged = object.__new__(_Logged)
    logged.__dict__.update(job.__dict__)
    logged.calls = []
    seen: list[str] = []
    async for batch in logged.stream(consumer="trainer", batch_size=4):  # waits span runs
        seen.extend(r.group_id for r in batch.records)
        await batch.ack()
    assert len(seen) == len(set(seen)) == 12
    handovers = [i for i, call in enumerate(logged.calls) if call.startswith("wait -")]
    assert handovers, " ".join(logged.calls)  # the batch continued as new under a waiting consumer
    after = [logged.calls[i + 1] for i in handovers if i + 1 < len(logged.calls)]
    assert all(call.startswith("wait") for call in after), logged.calls
    await asyncio.wait_for(job.wait(), 60)
    wid = workflow_id(job.id)
    runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{wid}'")]
    assert len(runs) >= 3
    histories = [await client.get_workflow_handle(wid, run_id=wf.run_id).fetch_history() for wf in runs]
    marked = [h for h in histories if b"stream-wait-handover" in b"".join(e.SerializeToString() for e in h.events)]
    assert marked  # the runs that said "handing over" recorded the patch, and replay on this code
    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    for history in marked:
        await replayer.replay_workflow(history)
