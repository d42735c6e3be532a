"""Rollouts outlive their batch's runs: a run continues as new without draining (issue #39).

A ``TasksetRun`` whose history grew long used to stop starting rollouts and wait for every one
in flight before continuing as new. Its children now start with the ``ABANDON`` parent-close
policy; the run carries the ones still running (``TasksetRunInput.carried``) and the next run
awaits them by activity (``rollouts.await_rollouts``). Each rollout still runs once and is
counted once; a worker SIGKILLed mid-turn while a run awaits carried rollouts loses nothing and
repeats no side effect (the agents' turns resume from their checkpoints); cancelling
the batch cancels the carried rollouts too and waits for their teardown. Real dev server, real
env servers and subprocesses, real worker processes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from agent_helpers import TurnsAgent
from temporal_helpers import ENV_FILE, TURNS_ENV, CountingAgent, WorkerProcess, async_wait_for, read_lines
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.worker import Replayer

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id
from durable_rollouts.workflows.types import ACT_AWAIT_ROLLOUTS

AGENT_TESTS = Path(__file__).resolve().parent.parent / "agents"  # agent_helpers, for the workers
SLOW_TURNS = 16  # of the two rows the run carries (0.5 s each)


def _rows(n: int, evidence: Path | None = None, source: str = ENV_FILE) -> Taskset:
    def args(i: int) -> dict:
        extra = {"pid_file": str(evidence / f"env{i}.pid")} if evidence else {}
        return {"expected": "x", "tag": f"row{i}", **extra}
    return Taskset("outlive", [Task(env="counting", id="echo", source=source, args=args(i)) for i in range(n)])


async def _runs(client, wid: str) -> list:
    """Every run's history of batch ``wid``, oldest first."""
    runs = [e async for e in client.list_workflows(f'WorkflowId="{wid}"')]
    return [await client.get_workflow_handle(wid, run_id=e.run_id).fetch_history()
            for e in sorted(runs, key=lambda e: e.start_time)]


def _turns(log: Path) -> list[tuple[str, int, int]]:
    """``TurnsAgent``'s lines of ``log``: (rollout id, turn, pid) each."""
    return [(rid, int(turn), int(pid)) for rid, turn, pid in (line.split() for line in read_lines(log))]


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
async def test_a_worker_killed_mid_turn_while_a_run_awaits_carried_rollouts_repeats_no_checkpointed_turn(
        client, dev_server, task_queue, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")  # a killed worker's substrates: gone soon
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # and its agent steps noticed soon
    turns = tmp_path / "turns.log"  # the env's line per tool call: rollout, turn, calling worker's pid
    agent_path = os.pathsep.join([str(AGENT_TESTS), os.environ.get("PYTHONPATH", "")])
    workers = [WorkerProcess(dev_server.address, task_queue, env={"PYTHONPATH": agent_path})]
    killed: list[int] = []
    try:
        # Six one-turn rows end and grow the history: the run continues as new with the two
        # 16-turn ones running; each of their turns checkpoints after its side effect. Their envs
        # are processes of their own, so they outlive the worker and the agents resume.
        agent = TurnsAgent(turns=1, turns_for={"row0": SLOW_TURNS, "row1": SLOW_TURNS}, think_s=0.5,
                           log=str(turns), answer="x", tool=True)
        handle = await start_job(_rows(8, source=TURNS_ENV), agent, runtime=SubprocessRuntime(TURNS_ENV),
                                 max_concurrent=8,
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
        # Mid-turn: both slow rows past their second turn, right after a checkpoint returned.
        checkpoints = Path(str(turns) + ".cp")

        def slow_rows_past_turn_2() -> bool:
            return len({rid for rid, turn, _ in _turns(checkpoints) if turn >= 2}) == 2

        await async_wait_for(slow_rows_past_turn_2, timeout=30)
        seen = len(read_lines(checkpoints))
        await async_wait_for(lambda: len(read_lines(checkpoints)) > seen, timeout=10)
        killed.append(workers[-1].pid)
        workers[-1].kill()  # with the await_rollouts activity and every agent on it
        workers.append(WorkerProcess(dev_server.address, task_queue, env={"PYTHONPATH": agent_path}))
        job = await asyncio.wait_for(handle.wait(), 180)
    finally:
        for worker in workers:
            worker.stop()
    ids = sorted(r.rollout_id for r in job.runs)
    assert len(ids) == len(set(ids)) == 8 and {r.status for r in job.runs} == {"succeeded"}
    effects: dict[str, list[tuple[int, int]]] = {}
    for rid, turn, pid in _turns(turns):
        effects.setdefault(rid, []).append((turn, pid))
    checkpointed = set(_turns(checkpoints))
    assert sorted(effects) == ids
    slow = [rid for rid in ids if len({turn for turn, _ in effects[rid]}) > 1]
    assert len(slow) == 2, effects
    for rid in ids:  # every turn's side effect, in order; none that was checkpointed runs again
        done = [turn for turn, _ in effects[rid]]
        want = SLOW_TURNS if rid in slow else 1
        assert sorted(set(done)) == list(range(1, want + 1)), (rid, effects[rid])
        again = [(turn, pid) for i, (turn, pid) in enumerate(effects[rid]) if turn in done[:i]]
        # At most the turn in flight at the kill: it ran on the killed worker, whose checkpoint
        # of it never returned, and runs once more where the rollout resumed.
        assert len(again) <= 1, (rid, effects[rid])
        for turn, _ in again:
            first = next(pid for t, pid in effects[rid] if t == turn)
            assert first in killed and (rid, turn, first) not in checkpointed, (rid, effects[rid])
    # The kill landed mid-way through the carried rollouts: each began on the killed worker and
    # resumed from its checkpoint on the new one.
    for rid in slow:
        pids = [pid for _, pid in effects[rid]]
        assert pids[0] in killed and pids[-1] not in killed, (rid, pids, killed)


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
