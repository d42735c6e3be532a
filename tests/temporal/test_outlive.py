"""Rollouts outlive their batch's runs: a run continues as new without draining (issue #39).

A ``TasksetRun`` whose history grew long used to stop starting rollouts and wait for every one
in flight before continuing as new. Its children now start with the ``ABANDON`` parent-close
policy; the run carries the ones still running (``TasksetRunInput.carried``) and the next run
awaits them by activity (``rollouts.await_rollouts``). Each rollout still runs once and is
counted once; a worker SIGKILLed while a run awaits carried rollouts loses nothing; cancelling
the batch cancels the carried rollouts too and waits for their teardown. Real dev server, real
env servers and subprocesses, real worker processes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, WorkerProcess, async_wait_for, read_lines
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.worker import Replayer

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id
from durable_rollouts.workflows.types import ACT_AWAIT_ROLLOUTS


def _rows(n: int, evidence: Path | None = None) -> Taskset:
    def args(i: int) -> dict:
        extra = {"pid_file": str(evidence / f"env{i}.pid")} if evidence else {}
        return {"expected": "x", "tag": f"row{i}", **extra}
    return Taskset("outlive", [Task(env="counting", id="echo", source=ENV_FILE, args=args(i)) for i in range(n)])


async def _runs(client, wid: str) -> list:
    """Every run's history of batch ``wid``, oldest first."""
    runs = [e async for e in client.list_workflows(f'WorkflowId="{wid}"')]
    return [await client.get_workflow_handle(wid, run_id=e.run_id).fetch_history()
            for e in sorted(runs, key=lambda e: e.start_time)]


def _count(history, kind: int) -> int:
    return sum(1 for e in history.events if e.event_type == kind)


def _awaits(history) -> int:
    return sum(1 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
               and e.activity_task_scheduled_event_attributes.activity_type.name == ACT_AWAIT_ROLLOUTS)


async def test_a_run_continues_as_new_with_rollouts_running_and_each_is_counted_once(
        client, task_queue, tmp_path) -> None:
    agents = tmp_path / "agents.log"
    # Ten quick rows end and grow the history past 40 events while the two slow ones still run.
    agent = CountingAgent(answer="x", seconds=0.2, log=str(agents), slow_tags=["row0", "row1"],
                          slow_seconds=6.0)
    handle = await start_job(_rows(12), agent, runtime=LocalRuntime(ENV_FILE), max_concurrent=12,
                             temporal=client, worker=True, task_queue=task_queue, max_history_events=40)
    job = await asyncio.wait_for(handle.wait(), 120)
    ids = sorted(r.rollout_id for r in job.runs)
    assert len(ids) == len(set(ids)) == 12 and {r.status for r in job.runs} == {"succeeded"}
    assert sorted(line.split()[1] for line in read_lines(agents)) == ids  # each ran once
    histories = await _runs(client, workflow_id(handle.job.id))
    assert len(histories) >= 2
    # Runs that continued as new while rollouts ran: more children started than ended in them.
    left = [_count(h, EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED)
            - _count(h, EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED) for h in histories[:-1]]
    assert any(n > 0 for n in left), left
    assert sum(_awaits(h) for h in histories[1:]) > 0  # the next runs awaited them
    progress = await handle.progress()
    assert progress.finished == 12 and progress.running == 0 and progress.done
    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    for history in histories:
        await replayer.replay_workflow(history)


@pytest.mark.slow  # a SIGKILLed worker: the await's 30 s heartbeat timeout, then the rest (~50 s)
@pytest.mark.timeout(300)
async def test_a_worker_killed_while_a_run_awaits_carried_rollouts_loses_none(
        client, dev_server, task_queue, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")  # a killed worker's substrates: gone soon
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # and its agent steps noticed soon
    agents = tmp_path / "agents.log"
    workers = [WorkerProcess(dev_server.address, task_queue)]
    killed: list[int] = []
    try:
        # Six quick rows end and grow the history: the run continues as new with the two slow ones.
        agent = CountingAgent(answer="x", seconds=0.3, log=str(agents), slow_tags=["row0", "row1"],
                              slow_seconds=8.0)
        handle = await start_job(_rows(8), agent, runtime=LocalRuntime(ENV_FILE), max_concurrent=8,
                                 temporal=client, worker=False, task_queue=task_queue,
                                 max_history_events=20)
        wid = workflow_id(handle.job.id)

        async def awaiting() -> bool:
            histories = await _runs(client, wid)
            return len(histories) >= 2 and _awaits(histories[-1]) > 0

        deadline = asyncio.get_running_loop().time() + 60
        while not await awaiting():
            assert asyncio.get_running_loop().time() < deadline, "no run awaits carried rollouts"
            await asyncio.sleep(0.2)
        killed.append(workers[-1].pid)
        workers[-1].kill()  # with the await_rollouts activity and every agent on it
        workers.append(WorkerProcess(dev_server.address, task_queue))
        job = await asyncio.wait_for(handle.wait(), 180)
    finally:
        for worker in workers:
            worker.stop()
    ids = sorted(r.rollout_id for r in job.runs)
    assert len(ids) == len(set(ids)) == 8 and {r.status for r in job.runs} == {"succeeded"}
    runs = [line.split() for line in read_lines(agents)]
    assert sorted({rid for _, rid in runs}) == ids
    for rid in ids:  # ran again only if it was in flight on the killed worker
        pids = [int(pid) for pid, r in runs if r == rid]
        assert all(pid in killed for pid in pids[:-1]), (rid, pids, killed)


@pytest.mark.slow  # waits for a continue-as-new with four 120 s agents running, then their teardown (~30 s)
async def test_cancelling_a_batch_cancels_its_carried_rollouts_and_tears_them_down(
        client, task_queue, tmp_path) -> None:
    agents = tmp_path / "agents.log"
    # One quick row ends (the run wakes with a long history) and it continues as new with the
    # four slow ones running.
    agent = CountingAgent(answer="x", seconds=0.2, log=str(agents), slow_tags=[f"row{i}" for i in range(4)],
                          slow_seconds=120.0)
    handle = await start_job(_rows(5, tmp_path), agent, runtime=SubprocessRuntime(ENV_FILE),
                             max_concurrent=5, temporal=client, worker=True, task_queue=task_queue,
                             max_history_events=20)
    wid = workflow_id(handle.job.id)
    await async_wait_for(lambda: len(read_lines(agents)) == 5, timeout=60, what="five agents")
    for _ in range(300):  # the first run continued as new with the four slow ones running
        histories = await _runs(client, wid)
        if len(histories) >= 2 and _awaits(histories[-1]):
            break
        await asyncio.sleep(0.2)
    assert len(histories) >= 2 and _awaits(histories[-1])
    pids = [int((tmp_path / f"env{i}.pid").read_text()) for i in range(4)]  # the slow rows' envs
    await handle.cancel()
    with pytest.raises(Exception):
        await asyncio.wait_for(handle.handle.result(), 60)

    def gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                pass
        return True

    await async_wait_for(gone, timeout=30, what="every carried rollout's substrate torn down")
    statuses = []
    for line in read_lines(agents):
        desc = await client.get_workflow_handle(line.split()[1]).describe()
        statuses.append(desc.raw_description.workflow_execution_info.status)
    assert sorted(statuses) == [WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED] + \
        [WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED] * 4
