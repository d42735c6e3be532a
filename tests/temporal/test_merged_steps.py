"""The shape of a Rollout started by this release (the merged-steps layout, ``RolloutInput.layout``).

A substrate that dies with its worker (``LocalRuntime``) is one agent step (layout 4): it opens
(provision -> connect -> start), works, grades and tears down; when it cannot grade, one close
step (grade -> teardown) does. A subprocess substrate, which outlives a killed worker, opens
with one local activity (provision -> connect -> start) and keeps grade and teardown apart. A new Rollout records
no patch marker and no TemporalChangeVersion upsert (its input names the layout), and its status
starts as running at the child's start (no upsert). Runs of older parents (input without a
layout) still ask ``rollout-v2-merged-steps``: the golden histories of faf8c5e replay that.
Counted from the real histories of a dev server.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temporal_helpers import ENV_FILE, read_lines
from temporalio import activity

from durable_rollouts.envserver.server import EnvServer
from durable_rollouts.errors import ConnectionLostError

from durable_rollouts.models import Task
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk import steps
from durable_rollouts.sdk.providers import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.providers import local as local_provider
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset
from durable_rollouts.workflows.types import ACT_AGENT, ACT_CLOSE, ACT_GRADE, ACT_OPEN, ACT_TEARDOWN


def _echo(expected: str, grade_log: Path | None = None) -> Task:
    args = {"expected": expected, **({"grade_log": str(grade_log)} if grade_log else {})}
    return Task(env="counting", id="echo", args=args, source=ENV_FILE)


def _served(job) -> set[str]:
    """The job's rollouts whose in-process substrate is still served (not torn down)."""
    return set(local_provider._BY_KEY) & {run.rollout_id for run in job.runs}


async def _rollouts(client, job) -> list:
    """The job's Rollout executions, once visibility lists all of them (it lags a finished job)."""
    query = f'WorkflowType="Rollout" AND RolloutsJobId="{job.id}"'
    found: list = []
    for _ in range(100):
        found = [wf async for wf in client.list_workflows(query)]
        if len(found) >= len(job.runs):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility lists {len(found)} of the job's {len(job.runs)} Rollouts")


async def _shape(client, job) -> list[list[str]]:
    """Per Rollout: its steps in order (local activities by marker), patch markers, upserts."""
    shapes = []
    for wf in await _rollouts(client, job):
        steps = []
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event in history.events:
            if event.HasField("marker_recorded_event_attributes"):
                marker = event.marker_recorded_event_attributes
                if marker.marker_name == "core_patch":
                    steps.append("patch")
                else:
                    data = json.loads(marker.details["data"].payloads[0].data)
                    steps.append(data["activity_type"])
            elif event.HasField("activity_task_scheduled_event_attributes"):
                steps.append(event.activity_task_scheduled_event_attributes.activity_type.name)
            elif event.HasField("upsert_workflow_search_attributes_event_attributes"):
                fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
                steps.extend(f"upsert {name}" for name in sorted(fields))
        shapes.append(steps)
    return shapes


async def test_an_in_process_rollout_is_one_agent_step(client, task_queue, evidence) -> None:
    grades = evidence / "grades.log"
    job = await run_taskset(Taskset("merged", [_echo("a", grades), _echo("b", grades)]),
                            FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), temporal=client,
                            worker=True, task_queue=task_queue)
    assert [r.reward for r in job.runs] == [1.0, 0.0] and [r.status for r in job.runs] == ["succeeded"] * 2
    shapes = await _shape(client, job)
    assert shapes == [[ACT_AGENT, "upsert RolloutsReward", "upsert RolloutsStatus"]] * 2, shapes
    assert len(read_lines(grades)) == 2  # one real grade per rollout
    assert not _served(job)  # torn down by the agent steps


async def test_an_in_process_rollout_opens_one_control_connection(client, task_queue, monkeypatch) -> None:
    """The one step starts the task, lets the agent work, grades and ends the session on one
    connection (two in layout 3: open, agent; three in layout 2: open, agent, close)."""
    accepted: list[int] = []
    real = EnvServer._on_connection

    async def counting(self, reader, writer):
        accepted.append(1)
        return await real(self, reader, writer)

    monkeypatch.setattr(EnvServer, "_on_connection", counting)
    job = await run_taskset(Taskset("merged-conns", [_echo("a"), _echo("b"), _echo("c")]),
                            FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), temporal=client,
                            worker=True, task_queue=task_queue)
    assert [r.reward for r in job.runs] == [1.0, 0.0, 0.0]
    assert len(accepted) == 1 * 3


async def test_a_grade_the_agent_step_cannot_get_is_left_to_the_close_step(
        client, task_queue, evidence, monkeypatch) -> None:
    """The channel fails as the agent step grades: it returns ungraded with its substrate (still
    up), and the close step grades (once) and tears down."""
    real = steps.close_rollout

    async def failing_in_the_agent_step(inp, **kwargs):
        if activity.info().activity_type == ACT_AGENT:
            raise ConnectionLostError("cut by the test before grading")
        return await real(inp, **kwargs)

    monkeypatch.setattr(steps, "close_rollout", failing_in_the_agent_step)
    grades = evidence / "grades.log"
    job = await run_taskset(Taskset("merged-fallback", [_echo("a", grades)]), FixedAgent(answer="a"),
                            runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
                            task_queue=task_queue)
    assert [(r.status, r.reward) for r in job.runs] == [("succeeded", 1.0)]
    assert await _shape(client, job) == [[ACT_AGENT, ACT_CLOSE,
                                             "upsert RolloutsReward", "upsert RolloutsStatus"]]
    assert len(read_lines(grades)) == 1
    assert not _served(job)


async def test_a_subprocess_substrate_opens_with_one_step_and_keeps_grade_and_teardown_apart(
        client, task_queue) -> None:
    job = await run_taskset(Taskset("merged-sub", [_echo("a")]), FixedAgent(answer="a"),
                            runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=True,
                            task_queue=task_queue)
    assert [(r.status, r.reward) for r in job.runs] == [("succeeded", 1.0)]
    assert await _shape(client, job) == [[ACT_OPEN, ACT_AGENT, ACT_GRADE, ACT_TEARDOWN,
                                             "upsert RolloutsReward", "upsert RolloutsStatus"]]


async def test_a_rejected_start_in_the_merged_step_is_a_failed_start(client, task_queue) -> None:
    """The merged step's failure names its part: a bad task id fails in 'starting task'."""
    bad = Task(env="counting", id="no_such_task", source=ENV_FILE)
    job = await run_taskset(Taskset("merged-bad", [bad]), FixedAgent(answer="a"),
                            runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
                            task_queue=task_queue)
    (run,) = job.runs
    assert (run.status, run.error_phase) == ("failed", "starting task"), run.error
