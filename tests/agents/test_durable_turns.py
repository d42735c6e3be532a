"""Durable agent turns: a worker SIGKILLed mid-agent resumes after the last checkpoint.

Real parts only: a dev server, worker processes (``python -m durable_rollouts.worker``) that are
SIGKILLed, the env in a subprocess (``SubprocessRuntime``) with a real bwrap/asyncssh workspace,
the built-in ``OpenAIChatAgent``. The model is the one stand-in (``agent_helpers.StepsModel``).
Side effects are counted in the env: ``log.txt`` gets one line per executed tool call.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import STEPS_ENV, TurnsAgent, tool_results
from temporal_helpers import async_wait_for, read_lines

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]
STEPS = [f"step-{k}" for k in range(1, 7)]


def steps_task(evidence: Path, n: int = 6) -> Task:
    return Task(env="steps", id="steps", source=STEPS_ENV, args={
        "n": n, "grade_log": str(evidence / "grades.log"), "ws_file": str(evidence / "ws")})


def workspace_log(evidence: Path) -> list[str]:
    ws = evidence / "ws"
    return read_lines(Path(ws.read_text()) / "log.txt") if ws.exists() else []


async def run_steps(client: Any, task_queue: str, evidence: Path, agent: Any, n: int = 6) -> Any:
    return await start_job(Taskset("turns", [steps_task(evidence, n)]), agent,
                           runtime=SubprocessRuntime(STEPS_ENV), temporal=client, worker=False,
                           task_queue=task_queue)


def assert_graded_once_correct(job: Any, evidence: Path, n: int = 6) -> Any:
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    assert read_lines(evidence / "grades.log") == [",".join(f"step-{k}" for k in range(1, n + 1))]
    return run


async def test_kill_while_a_model_request_is_in_flight_repeats_only_that_request(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """SIGKILL the worker while the 4th model request is in flight: the next worker resumes after
    turn 3; 8 requests (7 + the one in flight), each tool call ran once, reward 1.0, graded once."""
    llm = await model(hold={4})
    first = start_worker()
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    await asyncio.wait_for(llm.held.wait(), 60)
    assert workspace_log(evidence) == STEPS[:3]
    first.kill()
    start_worker()
    job = await asyncio.wait_for(handle.wait(), 90)
    run = assert_graded_once_correct(job, evidence)
    assert len(llm.requests) == 8
    assert [tool_results(r["body"]) for r in llm.requests] == [0, 1, 2, 3, 3, 4, 5, 6]
    # the stored trace is whole: the resumed attempt kept the checkpointed steps
    tools = [s.extra["arguments"]["command"] for s in run.trace.steps if s.source == "tool"]
    assert tools == [f"echo step-{k} >> log.txt" for k in range(1, 7)]
    assert run.trace.extra.get("resumed_at_step", 0) > 0
    assert [s.index for s in run.trace.steps] == list(range(len(run.trace.steps)))
    # the history holds the checkpoints as updates and replays deterministically
    from temporalio.worker import Replayer

    from durable_rollouts.temporal.codec import data_converter
    from durable_rollouts.workflows import Rollout

    history = await client.get_workflow_handle(run.rollout_id).fetch_history()
    kinds = [e.WhichOneof("attributes") for e in history.events]
    assert kinds.count("workflow_execution_update_completed_event_attributes") >= 7
    await Replayer(workflows=[Rollout], data_converter=data_converter()).replay_workflow(history)


async def test_kill_mid_turn_with_an_in_process_env_reruns_the_turns_once_on_a_fresh_substrate(
        client, task_queue, start_worker, model, evidence: Path, monkeypatch) -> None:
    """The env runs in the worker (``LocalRuntime``): SIGKILL the worker while the 4th model
    request is in flight, after 3 tool calls changed its workspace. The substrate died with the
    worker, so the agent step's retry finds that worker's queue unpolled and the rollout starts
    again on a fresh substrate in the live worker. Counted in each workspace: the first holds
    the 3 tool calls of attempt 1 once each, the second all 6 of attempt 2 once each; only the
    second is graded."""
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")
    llm = await model(hold={4})
    first = start_worker()
    handle = await start_job(Taskset("turns", [steps_task(evidence)]),
                             OpenAIChatAgent(model="m", base_url=llm.url),
                             runtime=LocalRuntime(STEPS_ENV), temporal=client, worker=False,
                             task_queue=task_queue)
    await asyncio.wait_for(llm.held.wait(), 60)
    first_workspace = Path((evidence / "ws").read_text())
    assert workspace_log(evidence) == STEPS[:3]
    first.kill()
    start_worker()
    job = await asyncio.wait_for(handle.wait(), 120)
    run = assert_graded_once_correct(job, evidence)
    assert run.attempts == 2 and "attempt 1 (agent loop)" in (run.error or ""), run.error
    assert Path((evidence / "ws").read_text()) != first_workspace
    assert read_lines(first_workspace / "log.txt") == STEPS[:3]  # attempt 1's calls, once each
    assert [tool_results(r["body"]) for r in llm.requests] == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]


async def test_kill_right_after_a_checkpoint_returns_loses_nothing(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """SIGKILL right after the first checkpoint returned (the reply to request 1 is durable,
    its tool call not yet run): no model request is repeated, each tool call runs once."""
    llm = await model()
    faults = {"ROLLOUTS_FAULTS": "after_checkpoint", "ROLLOUTS_FAULTS_DIR": str(evidence)}
    first = start_worker(**faults)
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    await async_wait_for(lambda: first.proc.poll() is not None, timeout=60, what="worker death")
    assert (evidence / "after_checkpoint.fired").exists() and workspace_log(evidence) == []
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 90)
    assert_graded_once_correct(job, evidence)
    assert len(llm.requests) == 7


async def test_kill_between_a_tool_call_and_its_checkpoint_reruns_only_that_call(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """SIGKILL after a tool call ran, before its result was checkpointed: that one call runs
    again (tool calls after the last checkpoint are at-least-once), no model request repeats.
    With an idempotent command the outcome is still exact."""
    idempotent = "echo step-{k} >> calls.txt && (grep -qx step-{k} log.txt || echo step-{k} >> log.txt)"
    llm = await model(command=idempotent)
    faults = {"ROLLOUTS_FAULTS": "after_tool", "ROLLOUTS_FAULTS_DIR": str(evidence)}
    first = start_worker(**faults)
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    await async_wait_for(lambda: first.proc.poll() is not None, timeout=60, what="worker death")
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 90)
    assert_graded_once_correct(job, evidence)
    assert len(llm.requests) == 7
    calls = read_lines(evidence / "grades.log.calls")
    assert calls == ["step-1", *STEPS]  # the first call ran twice, every other call once


async def test_a_429_with_retry_after_waits_then_resumes_without_repeating_a_turn(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """Request 3 answers 429 with ``Retry-After: 2``: the step fails retryably, Temporal retries
    it about 2 s later, it resumes after turn 2; no turn or tool call is repeated."""
    llm = await model(fail={3: (429, {"Retry-After": "2"})})
    start_worker()
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    job = await asyncio.wait_for(handle.wait(), 90)
    assert_graded_once_correct(job, evidence)
    assert [tool_results(r["body"]) for r in llm.requests] == [0, 1, 2, 2, 3, 4, 5, 6]
    waited = llm.requests[3]["at"] - llm.requests[2]["at"]
    assert 1.9 <= waited < 6.0, waited


async def test_a_401_fails_the_agent_once_with_the_servers_message(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """A 401 is final: one request, no retry; the rollout is graded as errored in the agent loop
    with the server's message."""
    llm = await model(fail={1: (401, {})})
    start_worker()
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    assert (run.status, run.error_phase, run.reward, run.grade_reward) == ("errored", "agent loop", None, 0.0), run
    assert "401" in (run.error or "") and "scripted 401" in (run.error or "")
    assert len(llm.requests) == 1 and len(read_lines(evidence / "grades.log")) == 1


async def test_a_custom_agent_resumes_from_its_restored_state(
        client, task_queue, start_worker, evidence: Path, monkeypatch) -> None:
    """A custom Agent using ``run.checkpoint`` / ``run.restored_state``: killed after turn 2 was
    checkpointed, it resumes at turn 3; every turn's side effect happened exactly once. The
    agent's heartbeat timeout is 5 s here, so its heartbeat details (what the Web UI shows of the
    agent step) reach the server every 4 s, before the 7.5 s agent is done (with the default
    20 s they follow every 16 s)."""
    from temporal_helpers import ENV_FILE

    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")

    log = evidence / "turns.log"
    first = start_worker()
    task = Task(env="counting", id="echo", source=ENV_FILE,
                args={"expected": "x", "grade_log": str(evidence / "grades.log")})
    handle = await start_job(Taskset("t", [task]), TurnsAgent(turns=5, think_s=1.5, log=str(log)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: len(read_lines(Path(str(log) + ".cp"))) == 2, timeout=60,
                         what="turn 2 checkpointed")
    rollout = client.get_workflow_handle(read_lines(log)[0].split()[0])
    progress = await _progress(client, rollout)
    first.kill()
    second = start_worker()
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    turns = [line.split() for line in read_lines(log)]
    assert [int(t[1]) for t in turns] == [1, 2, 3, 4, 5]
    assert turns[-1][2] == str(second.pid) and turns[1][2] == str(first.pid)
    assert run.trace.extra["resumed"] == 1 and len(read_lines(evidence / "grades.log")) == 1
    # what the Web UI showed mid-run: the turn in the workflow's current details and heartbeat
    assert progress[0].startswith("agent turn "), progress
    assert progress[1]["turn"] >= 2 and progress[1]["attempt"] == 1, progress


async def _progress(client: Any, rollout: Any) -> tuple[str, dict[str, Any]]:
    """The Rollout's current details and its agent activity's heartbeat details."""
    metadata = await rollout.query("__temporal_workflow_metadata")
    details = getattr(metadata, "current_details", None)
    if details is None and isinstance(metadata, dict):
        details = metadata.get("currentDetails", metadata.get("current_details"))
    beat: dict[str, Any] = {}
    for _ in range(40):  # heartbeats are throttled (one per 4 s here): wait for one with details
        desc = await rollout.describe()
        pending = desc.raw_description.pending_activities
        if pending and pending[0].heartbeat_details.payloads:
            (beat,) = await client.data_converter.decode(pending[0].heartbeat_details.payloads)
            if (beat.get("turn") or 0) >= 2:
                break
        await asyncio.sleep(0.1)
    return str(details), beat


async def test_a_model_that_keeps_failing_ends_the_agent_after_the_last_attempt_with_its_trace(
        client, task_queue, start_worker, model, evidence: Path) -> None:
    """Every request answers 503 (``Retry-After: 0.1``): Temporal retries the step up to its
    attempt limit (5); the last attempt retries in-process 3 times, then records the failure, so
    the rollout is graded ``errored`` with the server's message and its trace is kept."""
    llm = await model(fail={i: (503, {"Retry-After": "0.1"}) for i in range(1, 20)})
    start_worker()
    handle = await run_steps(client, task_queue, evidence, OpenAIChatAgent(model="m", base_url=llm.url))
    job = await asyncio.wait_for(handle.wait(), 120)
    (run,) = job.runs
    assert (run.status, run.error_phase) == ("errored", "agent loop"), run
    assert "503" in (run.error or "") and "scripted 503" in (run.error or "")
    assert len(llm.requests) == 4 + 4  # 4 failed attempts, then 1 + 3 in-process on the last
    assert run.trace_ref is not None and "503" in (run.trace.steps[-1].error or "")
    assert len(read_lines(evidence / "grades.log")) == 1
