"""Issue #39 item 6: a slow env import does not stall other rollouts.

One in-process worker runs a batch whose agents each sleep through 14 s of heartbeats (5 s
heartbeat timeout). While they run, a second batch on the same worker serves an env file whose
import sleeps 8 s (its first ``LocalRuntime`` provision imports it). Imported on the event loop,
that would freeze every running agent's heartbeats past their timeout; imported in a thread
(``envserver.loader.load_environment_async``), nothing else notices. Every rollout of the first
batch succeeds on its first agent attempt: one agent call each, no retried or timed-out activity
in any history.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for, read_lines
from temporalio.api.enums.v1 import EventType

from durable_rollouts import session
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

pytestmark = pytest.mark.timeout(180)

IMPORT_S = 8.0
AGENT_S = 14.0

SLOW_ENV = f'''
import time
time.sleep({IMPORT_S})  # a heavy import, e.g. a model library
from durable_rollouts import Environment
env = Environment(name="slow")

@env.template()
async def echo(expected: str = "x"):
    answer = yield f"Say {{expected!r}}."
    yield 1.0 if answer == expected else 0.0
'''


async def test_an_env_import_of_8_s_beside_a_running_batch_times_out_no_heartbeat(
        client, task_queue, tmp_path: Path) -> None:
    slow_env = tmp_path / "slow_env.py"
    slow_env.write_text(SLOW_ENV)
    log = tmp_path / "agents.log"
    busy = Taskset("busy", [Task(env="counting", id="echo", args={"expected": "a", "tag": str(i)},
                                 source=ENV_FILE) for i in range(4)])
    slow = Taskset("slow", [Task(env="slow", id="echo", args={"expected": "a"}, source=str(slow_env))])
    async with session():  # one worker for both batches
        first = await start_job(busy, CountingAgent(answer="a", seconds=AGENT_S, log=str(log)),
                                runtime=LocalRuntime(ENV_FILE), group=2, max_concurrent=8,
                                temporal=client, worker=True, task_queue=task_queue)
        await async_wait_for(lambda: len(read_lines(log)) == 8, timeout=60,
                             what="every agent of the first batch running")
        began = time.monotonic()
        second = await start_job(slow, FixedAgent(answer="a"), runtime=LocalRuntime(str(slow_env)),
                                 temporal=client, worker=True, task_queue=task_queue)
        ticks = 0
        while time.monotonic() - began < IMPORT_S:  # the loop stays responsive meanwhile
            await asyncio.sleep(0.1)
            ticks += 1
        slow_job, busy_job = await second.wait(), await first.wait()
    assert [r.status for r in slow_job.runs] == ["succeeded"] and slow_job.runs[0].reward == 1.0
    assert [r.status for r in busy_job.runs] == ["succeeded"] * 8
    assert all(r.reward == 1.0 and r.attempts == 1 for r in busy_job.runs)
    assert sorted(line.split()[1] for line in read_lines(log)) == sorted(
        r.rollout_id for r in busy_job.runs), "an agent step ran twice"
    for run in busy_job.runs:
        history = await client.get_workflow_handle(run.rollout_id).fetch_history()
        timed_out = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
        retried = [e.activity_task_started_event_attributes.attempt for e in history.events
                   if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                   and e.activity_task_started_event_attributes.attempt != 1]
        assert not timed_out and not retried, f"{run.rollout_id}: {timed_out} {retried}"
    assert ticks >= IMPORT_S / 0.1 * 0.5, f"the event loop stalled: {ticks} ticks"
