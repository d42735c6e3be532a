"""Layout 4: an in-process rollout is one agent step, which owns its substrate.

The workflow never learns the endpoint of a ``LocalRuntime`` substrate, so the step keeps it up
for its own retry (``activities.parked``), grades an agent failure that ends it, and tears it
down however it ends. Real dev server, real in-process env server; the agent raises a real model
API error from inside the step and checkpoints through the real ``checkpoint`` update.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, FailOnceAgent, async_wait_for, read_lines

from durable_rollouts.activities import parked
from durable_rollouts.activities import rollout as rollout_activities
from durable_rollouts.activities.parked import ParkedSubstrates
from durable_rollouts.models import AgentInput, Task
from durable_rollouts.sdk import steps
from durable_rollouts.sdk.providers import LocalRuntime
from durable_rollouts.sdk.providers import local as local_provider
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset, start_job
from durable_rollouts.workflows import taskset_run

pytestmark = pytest.mark.timeout(120)


def _echo(grade_log: Path) -> Task:
    return Task(env="counting", id="echo", args={"expected": "x", "grade_log": str(grade_log)},
                source=ENV_FILE)


def _served(job) -> set[str]:
    return {key for key in local_provider._BY_KEY if key.startswith(tuple(r.rollout_id for r in job.runs))}


def _attempts(log: Path) -> list[list[str]]:
    return [line.split() for line in read_lines(log)]


async def _one(client, task_queue, evidence: Path, name: str, **agent: object):
    """One in-process rollout of ``FailOnceAgent(**agent)``: the job, its run, the attempts log."""
    log = evidence / "attempts.log"
    job = await run_taskset(Taskset(name, [_echo(evidence / "grades.log")]),
                            FailOnceAgent(log=str(log), **agent), runtime=LocalRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    return job, run, _attempts(log)


def _park_elsewhere(monkeypatch) -> list[str]:
    """Make every retry land where nothing is parked (as in another process): a parked
    substrate is released at once instead. Returns the keys that would have been parked."""
    keys: list[str] = []

    def release(self, key, opened):
        keys.append(key)
        asyncio.get_running_loop().create_task(parked.release_quietly(opened))

    monkeypatch.setattr(ParkedSubstrates, "park", release)
    return keys


async def test_a_retried_step_resumes_the_session_it_parked(client, task_queue, evidence) -> None:
    """A retryable model error after a checkpoint: the retry in this process claims the parked
    substrate and resumes the same session from the checkpoint; one grade, nothing left."""
    job, run, rows = await _one(client, task_queue, evidence, "park")
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    (pid1, session1, restored1), (pid2, session2, restored2) = rows
    assert (restored1, restored2) == ("None", "1")  # the retry resumed from the checkpoint
    assert session1 == session2 and pid1 == pid2  # on the session the first attempt parked
    assert len(read_lines(evidence / "grades.log")) == 1
    assert not _served(job)


async def test_a_retry_that_finds_no_parked_substrate_after_a_checkpoint_starts_a_new_attempt(
        client, task_queue, evidence, monkeypatch) -> None:
    """As if the retry ran in another process: the checkpointed session is not here, so the step
    reports the substrate gone and the workflow opens a fresh one (rollout attempt 2)."""
    released = _park_elsewhere(monkeypatch)
    job, run, rows = await _one(client, task_queue, evidence, "park-gone")
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    assert "is gone with the worker of an earlier attempt" in (run.error or "")
    assert len(released) == 1
    # attempt 1 (checkpointed, failed), its retry (checkpoint, no session: gone before the
    # agent ran), attempt 2 from the start on a new session
    assert [r[2] for r in rows] == ["None", "None"] and rows[0][1] != rows[1][1]
    assert len(read_lines(evidence / "grades.log")) == 1
    await async_wait_for(lambda: not _served(job), what="released substrates")


async def test_a_retry_before_any_checkpoint_opens_afresh_in_the_same_attempt(
        client, task_queue, evidence, monkeypatch) -> None:
    """Nothing checkpointed: a retry that finds no parked substrate simply opens a new one."""
    _park_elsewhere(monkeypatch)
    job, run, rows = await _one(client, task_queue, evidence, "park-fresh", checkpoint=False)
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(rows) == 2 and rows[0][1] != rows[1][1]  # a fresh session for the retry
    await async_wait_for(lambda: not _served(job), what="released substrates")


@pytest.mark.parametrize("layout", [3, 4])
async def test_a_model_error_that_ends_the_agent_is_graded_as_in_layout_3(
        client, task_queue, evidence, monkeypatch, layout) -> None:
    """A non-retryable model error (recorded in the trace, not retried): graded once, torn down,
    errored in the agent loop with the env's real grade, in the one-step layout as in layout 3."""
    monkeypatch.setattr(taskset_run, "ROLLOUT_LAYOUT", layout)
    job, run, rows = await _one(client, task_queue, evidence, "final", retryable=False)
    assert (run.status, run.error_phase, run.reward) == ("errored", "agent loop", None), run.error
    assert run.grade is not None and (run.grade.reward, run.grade.is_error) == (0.0, False)
    assert "bad key" in (run.error or "")
    assert len(rows) == 1  # not retried
    assert len(read_lines(evidence / "grades.log")) == 1
    assert not _served(job)


async def test_a_step_failure_that_ends_it_is_graded_and_torn_down_there(evidence) -> None:
    """What the workflow would grade best effort (an infrastructure failure on the last attempt)
    the step grades itself on the substrate only it knows, then releases it."""
    task = _echo(evidence / "grades.log")
    opened = await steps.open_rollout(task, "final-key", LocalRuntime(ENV_FILE))
    inp = AgentInput(task=task, agent=FailOnceAgent(log=str(evidence / "unused.log")).spec(),
                     rollout_id="final-key")
    result = await rollout_activities._grade_failed(inp, opened, "trace store unavailable")
    assert (result.status, result.error, result.opened) == ("error", "trace store unavailable", None)
    assert result.grade is not None and result.grade.reward == 0.0
    assert len(read_lines(evidence / "grades.log")) == 1
    assert "final-key" not in local_provider._BY_KEY


async def test_a_cancelled_batch_leaves_no_substrate(client, task_queue, evidence) -> None:
    """Cancelled mid-agent: the step's own cleanup releases what the workflow cannot see."""
    log = evidence / "agent.log"
    handle = await start_job(Taskset("cancel", [_echo(evidence / "grades.log")]),
                             CountingAgent(seconds=60, log=str(log)), runtime=LocalRuntime(ENV_FILE),
                             group=2, temporal=client, worker=True, task_queue=task_queue)
    await async_wait_for(lambda: log.exists() and len(read_lines(log)) == 2, what="both agents running")
    keys = set(local_provider._BY_KEY)
    assert len(keys) >= 2
    await handle.cancel()
    with contextlib.suppress(Exception):  # a cancelled batch's wait raises
        await asyncio.wait_for(handle.wait(), 60)
    await async_wait_for(lambda: not (keys & set(local_provider._BY_KEY)), timeout=30,
                         what="substrates released after cancel")


async def test_an_unclaimed_parked_substrate_is_released_after_its_ttl(evidence) -> None:
    """The retry went elsewhere (or never came): the parked substrate is torn down on expiry."""
    runtime = LocalRuntime(ENV_FILE)
    opened = await steps.open_rollout(_echo(evidence / "grades.log"), "ttl-key", runtime)
    assert "ttl-key" in local_provider._BY_KEY
    shelf = ParkedSubstrates(ttl_s=0.2)
    shelf.park("ttl-key", opened)
    await async_wait_for(lambda: "ttl-key" not in local_provider._BY_KEY, timeout=10,
                         what="expired substrate released")
    assert shelf.claim("ttl-key") is None
