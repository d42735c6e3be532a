"""A full substrate queue is not a lost worker; a queue nobody polls still is.

In-process substrates (``LocalRuntime``) pin every later step to the provisioning worker's own
process queue. Real worker processes with ``--process-queue auto``, the dev server, and
``ROLLOUTS_QUEUE_TIMEOUT`` set small: a worker whose step slots stay full for longer than that
keeps its rollouts (the liveness probe answers), a SIGKILLed one loses them (reprovision).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporal_helpers import ENV_FILE, CountingAgent, WorkerProcess, async_wait_for, read_lines

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.workflows.types import ACT_QUEUE_ALIVE

PINNED = ("--process-queue", "auto")


def echo(evidence: Path) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE,
                args={"expected": "x", "grade_log": str(evidence / "grades.log")})


async def _probes(client, task_queue: str) -> tuple[int, int]:
    """(schedule-to-start timeouts, liveness probes) over the batch's Rollout histories."""
    timeouts = probes = 0
    async for wf in client.list_workflows(f"WorkflowType='Rollout' AND TaskQueue='{task_queue}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event in history.events:
            attrs = event.activity_task_timed_out_event_attributes
            if event.HasField("activity_task_timed_out_event_attributes") and "SCHEDULE_TO_START" in str(attrs):
                timeouts += 1
            if (event.HasField("activity_task_scheduled_event_attributes")
                    and event.activity_task_scheduled_event_attributes.activity_type.name == ACT_QUEUE_ALIVE):
                probes += 1
    return timeouts, probes


async def test_a_full_substrate_queue_with_a_live_worker_never_reprovisions(
        client, dev_server, task_queue, workers, evidence: Path, monkeypatch) -> None:
    """Two step slots, four rollouts whose agents take 4 s each, a 1.5 s queue timeout: steps
    wait on the full process queue well past the timeout, the probe finds the worker alive, and
    every rollout finishes on its first substrate, graded once."""
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "1.5")
    agents = evidence / "agents.log"
    workers.append(WorkerProcess(dev_server.address, task_queue,
                                 args=(*PINNED, "--max-concurrent-activities", "2")))
    handle = await start_job(Taskset("t", [echo(evidence)]),
                             CountingAgent(answer="x", seconds=4.0, log=str(agents)),
                             runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue, group=4, max_concurrent=4)
    job = await asyncio.wait_for(handle.wait(), 90)
    assert [(r.status, r.reward, r.attempts) for r in job.runs] == [("succeeded", 1.0, 1)] * 4, \
        [r.error for r in job.runs]
    assert len(read_lines(agents)) == 4 and len(read_lines(evidence / "grades.log")) == 4
    timeouts, probes = await _probes(client, task_queue)
    assert timeouts >= 1 and probes == timeouts, (timeouts, probes)  # the queue really was full


async def test_a_substrate_queue_nobody_polls_still_reprovisions(
        client, dev_server, task_queue, workers, evidence: Path, monkeypatch) -> None:
    """SIGKILL the worker holding an in-process substrate mid-agent: its process queue and its
    liveness queue go unpolled, the probe is not picked up, and the rollout reprovisions on the
    live worker (attempt 2), graded once."""
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "2")
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # the dead worker's agent step: noticed soon
    agents = evidence / "agents.log"
    first = WorkerProcess(dev_server.address, task_queue, args=PINNED)
    workers.append(first)
    handle = await start_job(Taskset("t", [echo(evidence)]),
                             CountingAgent(answer="x", seconds=3.0, log=str(agents)),
                             runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: len(read_lines(agents)) == 1, what="agent start")
    first.kill()
    second = WorkerProcess(dev_server.address, task_queue, args=PINNED)
    workers.append(second)
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    assert [line.split()[0] for line in read_lines(agents)] == [str(first.pid), str(second.pid)]
    assert len(read_lines(evidence / "grades.log")) == 1
    timeouts, probes = await _probes(client, task_queue)
    assert probes >= 1, (timeouts, probes)  # lost only after the probe went unanswered
