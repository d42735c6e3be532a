"""Checkpoint edges: the direct executor, error mapping, a zombie attempt, a >2 MB checkpoint.

Same real parts as ``test_durable_turns.py`` (dev server, SIGKILL/SIGSTOP-ed worker processes,
the env in a subprocess with a bwrap/asyncssh workspace); the model is ``StepsModel``.
"""

from __future__ import annotations

import asyncio
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from agent_helpers import STEPS_ENV, TurnsAgent, tool_results
from temporal_helpers import ENV_FILE, async_wait_for, read_lines
from temporalio.exceptions import ApplicationError

from durable_rollouts.activities.failures import map_errors
from durable_rollouts.errors import ModelAPIError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

pytestmark = pytest.mark.timeout(180)
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def counting_task(evidence: Path) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE,
                args={"expected": "x", "grade_log": str(evidence / "grades.log")})


def test_model_api_errors_map_to_retry_after_or_final_application_errors() -> None:
    """At the activity edge a 429 becomes a retryable ApplicationError whose next_retry_delay is
    the server's Retry-After; a 401 a non-retryable one carrying the server's message."""
    with pytest.raises(ApplicationError) as limited, map_errors():
        raise ModelAPIError("answered 429: slow down", retryable=True, retry_after_s=2.0, status=429)
    assert not limited.value.non_retryable and limited.value.next_retry_delay == timedelta(seconds=2)
    assert limited.value.type == "ModelAPIError"
    with pytest.raises(ApplicationError) as refused, map_errors():
        raise ModelAPIError("answered 401: bad key", retryable=False, status=401)
    assert refused.value.non_retryable and "bad key" in refused.value.message


async def test_without_temporal_checkpoint_returns_and_the_agent_runs_through(evidence: Path) -> None:
    """On the direct executor (no durable checkpointer) ``run.checkpoint`` records locally and
    returns: a checkpointing agent runs as anywhere else."""
    log = evidence / "turns.log"
    job = await run_direct(Taskset("t", [counting_task(evidence)]),
                           TurnsAgent(turns=3, think_s=0.0, log=str(log)), LocalRuntime(ENV_FILE))
    assert job.runs[0].reward == 1.0, job.runs[0].error
    assert [line.split()[1] for line in read_lines(Path(f"{log}.cp"))] == ["1", "2", "3"]


@needs_bwrap
async def test_direct_executor_retries_a_429_from_the_last_checkpoint(model, evidence: Path) -> None:
    """In-process, a retryable model error is retried after Retry-After from the last local
    checkpoint: no turn repeats, the reward is right."""
    llm = await model(fail={3: (429, {"Retry-After": "1"})})
    task = Task(env="steps", id="steps", source=STEPS_ENV, args={"grade_log": str(evidence / "grades.log")})
    job = await run_direct(Taskset("t", [task]), OpenAIChatAgent(model="m", base_url=llm.url),
                           LocalRuntime(STEPS_ENV))
    assert job.runs[0].reward == 1.0, job.runs[0].error
    assert [tool_results(r["body"]) for r in llm.requests] == [0, 1, 2, 2, 3, 4, 5, 6]
    assert llm.requests[3]["at"] - llm.requests[2]["at"] >= 0.9


async def test_a_checkpoint_from_a_superseded_attempt_is_rejected(
        client, task_queue, start_worker, evidence: Path) -> None:
    """After a SIGKILL the retried attempt took over (and fenced the old one off): a checkpoint
    update carrying the old attempt's fence is rejected by the Rollout's validator and changes
    nothing; the run finishes with every turn exactly once."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from durable_rollouts.step_io import Checkpoint, CheckpointFence

    log = evidence / "turns.log"
    first = start_worker()
    handle = await start_job(Taskset("t", [counting_task(evidence)]),
                             TurnsAgent(turns=6, think_s=1.0, log=str(log)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    cps = Path(f"{log}.cp")
    await async_wait_for(lambda: len(read_lines(cps)) >= 1, timeout=60, what="first checkpoint")
    first.kill()
    second = start_worker()
    await async_wait_for(lambda: any(line.endswith(f" {second.pid}") for line in read_lines(cps)),
                         timeout=60, what="the retry resumed and checkpointed")
    rollout = client.get_workflow_handle(read_lines(cps)[0].split()[0])
    zombie = Checkpoint(state={"turn": 99}, fence=CheckpointFence(schedule=1, attempt=1), turn=99)
    with pytest.raises((WorkflowUpdateFailedError, RPCError)) as refused:
        await rollout.execute_update("checkpoint", zombie)
    assert "stale agent attempt" in str(getattr(refused.value, "cause", None) or refused.value)
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    assert [int(line.split()[1]) for line in read_lines(cps)] == list(range(1, 7))
    assert [int(line.split()[1]) for line in read_lines(log)] == list(range(1, 7))
    assert len(read_lines(evidence / "grades.log")) == 1


@needs_bwrap
async def test_a_checkpoint_larger_than_2mb_survives_a_crash(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """A long conversation (25 turns x 100 KB of tool output, ~2.5 MB checkpointed) survives a
    SIGKILL mid-request: the resumed attempt gets it all back and repeats one request only."""
    from test_durable_turns import run_steps

    llm = await model(n=25, hold={24}, output_bytes=100_000)
    first = start_worker()
    agent = OpenAIChatAgent(model="m", base_url=llm.url, max_steps=30, max_output_chars=200_000)
    handle = await run_steps(client, task_queue, evidence, agent, n=25)
    await asyncio.wait_for(llm.held.wait(), 120)
    first.kill()
    start_worker()
    job = await asyncio.wait_for(handle.wait(), 120)
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    assert len(llm.requests) == 27
    assert sum(len(s.messages[0]["content"]) for s in run.trace.steps if s.source == "tool") > 2_000_000
