"""The worker watch (``workflows.worker_watch``): one liveness beat per worker process.

Real worker processes on the session's dev server. The dead-worker case with the defaults is
``test_survival.test_a_dead_workers_agent_step_runs_again_within_30_s``; an agent step that its
own retry policy already moved to a live worker is left alone
(``test_survival.test_worker_killed_mid_agent_another_worker_finishes_once``, 5 s heartbeats).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for, read_lines

from durable_rollouts.models import Task
from durable_rollouts.runtimes import SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.workflows.worker_watch import WatchResult


def _echo(evidence: Path) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(evidence / "grades.log")})


async def _watches(client, pid: int) -> dict[str, int]:
    """The WorkerWatch workflows of worker process ``pid``: id -> status."""
    found = {}
    async for wf in client.list_workflows("WorkflowType = 'WorkerWatch'"):
        if f":{pid}:watch-" in wf.id:
            found[wf.id] = int(wf.status or 0)
    return found


async def _wait_watches(client, pid: int, predicate, what: str, timeout: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watches = await _watches(client, pid)
        if predicate(watches):
            return watches
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {await _watches(client, pid)}")


RUNNING, COMPLETED = 1, 2


@pytest.mark.slow  # SIGSTOPs a worker until the watch takes it for dead (~50 s)
async def test_a_stalled_worker_is_taken_for_dead_then_watched_again_when_it_resumes(
        client, task_queue, start_worker, evidence: Path) -> None:
    """SIGSTOP the worker running an agent (defaults: 10 s watch, 300 s agent heartbeat): its
    watch reports it, the agent runs again on the other worker long before the agent step's own
    heartbeat timeout (300 s), and the env grades once. SIGCONT: the revived worker watches itself
    again (a new WorkerWatch) instead of staying unwatched."""
    agents = evidence / "agents.log"
    pair = {w.pid: w for w in (start_worker(), start_worker())}
    for pid in pair:
        await _wait_watches(client, pid, lambda w: RUNNING in w.values(), "a running watch")
    handle = await start_job(Taskset("t", [_echo(evidence)]),
                             CountingAgent(answer="x", seconds=15.0, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: len(read_lines(agents)) == 1, what="agent start")
    holder = int(read_lines(agents)[0].split()[0])
    os.kill(holder, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        await async_wait_for(lambda: len(read_lines(agents)) >= 2, timeout=45, what="agent again")
        # A hung worker (unlike a dead one) keeps its connections: the server hands it the
        # watch's and the Rollout's workflow tasks, each taken back after its task timeout.
        assert time.monotonic() - stopped <= 45.0
        (other,) = set(pair) - {holder}
        assert read_lines(agents)[1].startswith(f"{other} ")
        watches = await _wait_watches(client, holder, lambda w: COMPLETED in w.values(),
                                      "the stalled worker's watch to report it")
        (first,) = [wid for wid, status in watches.items() if status == COMPLETED]
        result = await client.get_workflow_handle(first, result_type=WatchResult).result()
        assert result.lost == 1 and "Heartbeat" in result.why, result
    finally:
        os.kill(holder, signal.SIGCONT)
    await _wait_watches(client, holder, lambda w: len(w) == 2 and RUNNING in w.values(),
                        "the revived worker's new watch")
    (run,) = (await asyncio.wait_for(handle.wait(), 90)).runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    assert len(read_lines(evidence / "grades.log")) == 1


async def test_a_worker_that_shuts_down_ends_its_watch_without_reporting_anything(
        client, start_worker) -> None:
    """SIGTERM: the worker ends its own watch (the sentinel returns ``stopped``) before it stops,
    so nothing is signalled and no watch is left running for it."""
    worker = start_worker()
    await _wait_watches(client, worker.pid, lambda w: RUNNING in w.values(), "a running watch")
    worker.stop()
    assert worker.proc.returncode == 0
    (wid,) = await _watches(client, worker.pid)
    result = await client.get_workflow_handle(wid, result_type=WatchResult).result()
    assert result == WatchResult(lost=0, why="the worker shut down")
