"""A streamed batch run as parts survives its worker's SIGKILL, and a cancel stops every part
(issue #42 item 2, with the stream).

``ROLLOUTS_CHILDREN_PER_WORKFLOW=4`` and ``max_concurrent=12``: 16 rollouts (8 groups of 2) run as
3 parts feeding one stream. The rollouts' worker is a real process, SIGKILLed mid-turn; a second
worker finishes the batch. Each agent turn calls a tool that writes a line in the env's own
process (``turns_env``), then checkpoints; the env also counts every grade, and the consumer every
group it applied: each group reaches the consumer once, each rollout is graded once, every turn's
side effect happens, and none that was checkpointed happens again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from agent_helpers import TurnsAgent
from temporal_helpers import ENV_FILE, TURNS_ENV, CountingAgent, async_wait_for, read_lines
from temporalio.client import WorkflowFailureError

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.jobs import describe
from durable_rollouts.workflows import workflow_id

ROWS, GROUP, WIDTH = 8, 2, 12
TURNS = 4  # of each rollout's agent: a tool call in its env (counted there), then a checkpoint
AGENT_TESTS = Path(__file__).resolve().parent.parent / "agents"  # agent_helpers, for the workers


@pytest.fixture(autouse=True)
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_CHILDREN_PER_WORKFLOW", "4")
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # a dead worker's agent steps noticed sooner


def _taskset(name: str, evidence: Path, source: str = ENV_FILE) -> Taskset:
    return Taskset(name, [Task(env="counting", id="echo", source=source, args={
        "expected": "x", "tag": f"row{i}", "grade_log": str(evidence / "grades.log")}) for i in range(ROWS)])


async def test_a_wide_stream_survives_its_worker_killed_mid_turn(client, task_queue, start_worker,
                                                                 evidence: Path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")  # the killed worker's queues: gone soon
    turns = evidence / "turns.log"  # the env's line per tool call: rollout, turn, calling worker's pid
    checkpoints = Path(str(turns) + ".cp")
    agent_path = os.pathsep.join([str(AGENT_TESTS), os.environ.get("PYTHONPATH", "")])
    first = start_worker(PYTHONPATH=agent_path)
    job = await _taskset("wide-crash", evidence, TURNS_ENV).start(
        TurnsAgent(turns=TURNS, think_s=0.5, log=str(turns), answer="x", tool=True),
        runtime=SubprocessRuntime(TURNS_ENV), group=GROUP, max_concurrent=WIDTH, temporal=client,
        worker=False, task_queue=task_queue, consumers=["trainer"], linger_s=120)
    # Mid-turn: six rollouts past their first checkpoint, right after another checkpoint returned.
    await async_wait_for(lambda: len({line.split()[0] for line in read_lines(checkpoints)}) >= 6,
                         timeout=60)
    seen = len(read_lines(checkpoints))
    await async_wait_for(lambda: len(read_lines(checkpoints)) > seen, timeout=10)
    first.kill()  # SIGKILL, with the agents of every part on it
    start_worker(PYTHONPATH=agent_path)
    applied: list[str] = []
    async with asyncio.timeout(240):
        async for batch in job.stream(consumer="trainer", batch_size=2):
            applied.extend(g[0].group_id for g in batch.groups)
            assert all(len(g) == GROUP and {r.reward for r in g} == {1.0} for g in batch.groups)
            await batch.ack()
        done = await job.wait()

    assert sorted(Counter(applied).values()) == [1] * ROWS  # every group applied once
    graded = Counter(line.split()[0] for line in read_lines(evidence / "grades.log"))
    assert graded == {f"row{i}": GROUP for i in range(ROWS)}  # every rollout graded once
    ids = sorted(r.rollout_id for r in done.runs)
    assert len(set(ids)) == ROWS * GROUP and {r.status for r in done.runs} == {"succeeded"}
    effects: dict[str, list[tuple[int, int]]] = {}
    for line in read_lines(turns):
        rid, turn, pid = line.split()
        effects.setdefault(rid, []).append((int(turn), int(pid)))
    checkpointed = {tuple(line.split()) for line in read_lines(checkpoints)}
    assert sorted(effects) == ids
    for rid in ids:  # every turn's side effect; none that was checkpointed runs again
        done_turns = [turn for turn, _ in effects[rid]]
        assert sorted(set(done_turns)) == list(range(1, TURNS + 1)), (rid, effects[rid])
        again = [(turn, pid) for i, (turn, pid) in enumerate(effects[rid]) if turn in done_turns[:i]]
        assert len(again) <= 1, (rid, effects[rid])  # at most the turn in flight at the kill
        for turn, _ in again:
            ran = next(pid for t, pid in effects[rid] if t == turn)
            assert ran == first.pid and (rid, str(turn), str(ran)) not in checkpointed, (rid, effects[rid])
    moved = [rid for rid in ids if {pid for _, pid in effects[rid]} - {first.pid}
             and effects[rid][0][1] == first.pid]
    assert moved, effects  # the kill landed mid-way: rollouts began on it and finished elsewhere
    parts = [await describe(client, f"{workflow_id(job.id)}/part-{k}") for k in range(4)]
    assert [p is not None for p in parts] == [True, True, True, False]


async def test_cancelling_a_wide_stream_cancels_every_part(client, task_queue, tmp_path) -> None:
    log = tmp_path / "agents.log"
    job = await _taskset("wide-cancel", tmp_path).start(
        CountingAgent(answer="x", seconds=60.0, log=str(log)), runtime=LocalRuntime(ENV_FILE),
        group=GROUP, max_concurrent=WIDTH, temporal=client, worker=True, task_queue=task_queue,
        consumers=["trainer"])
    await async_wait_for(lambda: len(read_lines(log)) >= WIDTH, what="a full width of agents")
    began = time.monotonic()
    await job.cancel()
    with contextlib.suppress(WorkflowFailureError):  # cancelled: its parts' rollouts tore down first
        await asyncio.wait_for(client.get_workflow_handle(workflow_id(job.id)).result(), 45)
    assert time.monotonic() - began < 30  # the 60 s agents were cancelled, not waited for
    await job.release()
    for k in range(3):
        part = await describe(client, f"{workflow_id(job.id)}/part-{k}")
        assert part is not None and part.status is not None and part.status.name == "CANCELED", k
    batch = await describe(client, workflow_id(job.id))
    assert batch is not None and batch.status is not None and batch.status.name == "CANCELED"
    assert len(read_lines(log)) == WIDTH  # nothing started after the cancel
