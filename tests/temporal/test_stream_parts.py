"""A streamed batch run as parts survives its worker's SIGKILL, and a cancel stops every part
(issue #42 item 2, with the stream).

``ROLLOUTS_CHILDREN_PER_WORKFLOW=4`` and ``max_concurrent=12``: 16 rollouts (8 groups of 2) run as
3 parts feeding one stream. The rollouts' worker is a real process, SIGKILLed while the first
agents sleep; a second worker finishes the batch. The env counts every grade on disk
(``counting_env``), the agent every start (``CountingAgent``), the consumer every group it applied:
each group reaches the consumer once, each rollout is graded once, and only rollouts in flight on
the killed worker ran their agent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for, read_lines
from temporalio.client import WorkflowFailureError

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.jobs import describe
from durable_rollouts.workflows import workflow_id

ROWS, GROUP, WIDTH = 8, 2, 12


@pytest.fixture(autouse=True)
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_CHILDREN_PER_WORKFLOW", "4")
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # a dead worker's agent step noticed sooner


def _taskset(name: str, evidence: Path) -> Taskset:
    return Taskset(name, [Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "tag": f"row{i}", "grade_log": str(evidence / "grades.log")}) for i in range(ROWS)])


async def test_a_wide_stream_survives_its_worker_killed(client, task_queue, start_worker,
                                                        evidence: Path) -> None:
    agents = evidence / "agents.log"
    first = start_worker()
    job = await _taskset("wide-crash", evidence).start(
        CountingAgent(answer="x", seconds=2.0, log=str(agents)), runtime=LocalRuntime(ENV_FILE),
        group=GROUP, max_concurrent=WIDTH, temporal=client, worker=False, task_queue=task_queue,
        consumers=["trainer"], linger_s=120)
    await async_wait_for(lambda: len(read_lines(agents)) >= 6, what="agents running")
    first.kill()  # SIGKILL while every agent so far sleeps (none graded yet)
    before = {line.split()[1] for line in read_lines(agents)}
    assert not read_lines(evidence / "grades.log")
    start_worker()
    applied: list[str] = []
    async with asyncio.timeout(180):
        async for batch in job.stream(consumer="trainer", batch_size=2):
            applied.extend(g[0].group_id for g in batch.groups)
            assert all(len(g) == GROUP and {r.reward for r in g} == {1.0} for g in batch.groups)
            await batch.ack()
        done = await job.wait()

    assert sorted(Counter(applied).values()) == [1] * ROWS  # every group applied once
    graded = Counter(line.split()[0] for line in read_lines(evidence / "grades.log"))
    assert graded == {f"row{i}": GROUP for i in range(ROWS)}  # every rollout graded once
    started = Counter(line.split()[1] for line in read_lines(agents))
    assert sorted(started) == sorted(r.rollout_id for r in done.runs) and len(started) == ROWS * GROUP
    twice = {rid for rid, n in started.items() if n > 1}
    assert twice and twice <= before  # the killed worker's rollouts ran again, no other did
    assert {r.status for r in done.runs} == {"succeeded"}
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
