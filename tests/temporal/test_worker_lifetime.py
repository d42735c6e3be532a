"""The in-process worker's lifetime (issue #16): it runs while a batch or a ``session()`` uses it.

A worker left running when the loop ends is cancelled by ``asyncio.run`` together with its
pollers and can wedge the process for ever, so a finished batch call must leave none behind.
"""

from __future__ import annotations

import asyncio

import pytest
from temporal_helpers import ENV_FILE

from durable_rollouts import session
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent, SleepAgent
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.lifetime import running
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset, start_job


def _tasks(n: int) -> Taskset:
    return Taskset("echoes", [Task(env="counting", id="echo", args={"expected": "ab"[i % 2]}, source=ENV_FILE)
                              for i in range(n)])


def _ours() -> list[asyncio.Task[object]]:
    """Tasks of temporalio or this package still on the loop (besides the test's own)."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
            and getattr(t.get_coro(), "__qualname__", "").split(".")[0] in
            ("Worker", "_WorkflowWorker", "_ActivityWorker", "RolloutWorker", "runner")]


async def test_a_batch_stops_its_in_process_worker_before_it_returns(client, task_queue) -> None:
    """After ``run_taskset`` returns, no in-process worker and none of its tasks are running."""
    job = await run_taskset(_tasks(2), FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
                            temporal=client, worker=True, task_queue=task_queue)
    assert [r.status for r in job.runs] == ["succeeded"] * 4
    assert running() == [] and _ours() == []


async def test_a_session_keeps_one_worker_for_all_its_batches(client, task_queue) -> None:
    """Inside ``session()`` the batches of a training loop share one worker; it stops at the end."""
    seen = []
    async with session():
        job = await Job.start("loop", group=2)
        for _ in range(3):
            await run_taskset(_tasks(2), FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), job=job,
                              temporal=client, worker=True, task_queue=task_queue)
            seen.append(running())
            assert _ours()  # its pollers are on the loop while the session is open
    assert len(job.runs) == 12 and job.batches == 3
    assert len(seen[0]) == 1 and seen == [seen[0]] * 3  # the same worker object each time
    assert running() == [] and _ours() == []


async def test_a_wait_that_is_cancelled_stops_the_worker_and_a_new_wait_restarts_it(client, task_queue) -> None:
    """``wait()`` gives the worker back even when cancelled; waiting again takes a new one and
    the batch completes."""
    handle = await start_job(_tasks(2), SleepAgent(seconds=1.0, answer="a"), runtime=LocalRuntime(ENV_FILE),
                             temporal=client, worker=True, task_queue=task_queue)
    assert len(running()) == 1  # held by the handle until it is waited for
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(handle.wait(), 0.2)
    assert running() == []
    job = await handle.wait()
    assert [r.status for r in job.runs] == ["succeeded"] * 2
    assert running() == [] and _ours() == []


async def test_a_batch_next_to_its_worker_starts_eagerly_and_one_without_does_not(
        client, task_queue, start_worker) -> None:
    """With an in-process worker the first workflow task comes back in the start response (eager
    workflow start: no dispatch through matching); a batch for outside workers asks no such thing.
    The server records what it granted in the start event (``eager_execution_accepted``)."""

    async def accepted(handle) -> bool:
        history = await handle.fetch_history()
        return history.events[0].workflow_execution_started_event_attributes.eager_execution_accepted

    eager = await start_job(_tasks(1), FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    job = await eager.wait()
    assert [r.status for r in job.runs] == ["succeeded"] and await accepted(eager.handle)
    start_worker()  # a worker process: this process runs none for the queue
    remote = await start_job(_tasks(1), FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE),
                             temporal=client, worker=False, task_queue=task_queue)
    job = await asyncio.wait_for(remote.wait(), 60)
    assert [r.status for r in job.runs] == ["succeeded"] and not await accepted(remote.handle)


async def test_the_sticky_timeout_comes_from_the_setting(client, task_queue, monkeypatch) -> None:
    """A workflow's next task waits ``ROLLOUTS_STICKY_TIMEOUT`` (10 s) for the worker that has it
    cached: at 5 s, a long batch run's task on a busy box went to the normal queue and was
    replayed whole (5,000 events, a 16 MiB peak in the worker). A bad value is refused."""
    from datetime import timedelta

    from durable_rollouts.errors import ConfigError
    from durable_rollouts.worker import build_worker

    built: list[str] = []

    def sticky() -> timedelta:  # a queue each: one process registers one worker per queue
        built.append(f"{task_queue}-{len(built)}")
        worker = build_worker(client, task_queue=built[-1])
        return worker.workers[0].config()["sticky_queue_schedule_to_start_timeout"]

    assert sticky() == timedelta(seconds=10)
    monkeypatch.setenv("ROLLOUTS_STICKY_TIMEOUT", "2.5")
    assert sticky() == timedelta(seconds=2.5)
    monkeypatch.setenv("ROLLOUTS_STICKY_TIMEOUT", "0")
    with pytest.raises(ConfigError, match="ROLLOUTS_STICKY_TIMEOUT"):
        sticky()
