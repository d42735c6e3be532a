"""The direct executor: run a taskset with plain asyncio in one process, no Temporal.

It runs the same step functions as the durable path, so the two differ only in durability (the
benchmarks compare them). Failures never escape the batch: each becomes a run with a status, an
error and the phase it happened in. Imports sdk modules only; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..errors import StepFailed
from ..models import (
    AgentSpec,
    Endpoint,
    Session,
    Step,
    Task,
    Trace,
)
from ..step_io import (
    AgentInput,
    GradeInput,
    VerifyInput,
    graded_outcome,
)
from . import agent_step, merged_steps, steps, verify_once
from .agents import Agent, as_agent
from .job import Job
from .providers.base import DurableProvider
from .run import Run
from .tracestore import TraceStore
from .placement import resolve_placement
from .taskset_hooks import check_taskset_flags
from .validation import validate_batch

if TYPE_CHECKING:
    from .taskset import Taskset

__all__ = ["run_direct"]

log = logging.getLogger(__name__)

_IN_PROCESS = AgentSpec(path="in-process")  # the direct path hands the agent object over as is
_BEFORE_LAUNCH = {"resolving", "provisioning", "connecting", "starting task"}


async def run_direct(taskset: Taskset, agent: Agent | Any, runtime: Any = None, group: int | None = None,
                     max_concurrent: int = 16, rollout_timeout: float | None = None, *,
                     job: Job | None = None, trace_store: TraceStore | None = None) -> Job:
    """Run every row ``group`` times, at most ``max_concurrent`` at once, and return the Job.

    Rows expand task-major; a row's repeats share one ``group_id`` and one resolved task
    (``taskset.resolve_task`` is called once per group).

    Raises:
        ConfigError: a setting that cannot work (checked before anything starts).
    """
    runtime = resolve_placement(runtime, taskset)  # a built-in, any provider callable, or the default
    agent = as_agent(agent)  # ours, or a HUD v6 agent (wrapped)
    group = Job.batch_group(group, job)
    check_taskset_flags(taskset, group=group, runtime=runtime)
    validate_batch(taskset, runtime=runtime, group=group, max_concurrent=max_concurrent,
                   rollout_timeout=rollout_timeout, agent_timeout=agent.timeout_s)
    job = job if job is not None else Job(name=taskset.name, group=group, taskset=taskset.name)
    batch = job.batches
    job.batches += 1
    store = trace_store or TraceStore()
    limit = asyncio.Semaphore(max_concurrent)
    ctx = _Batch(agent, runtime, store, limit, rollout_timeout)

    groups = []
    for row_index, row in enumerate(taskset):
        group_id = uuid.uuid4().hex
        runs = [
            Run(task=row, slug=row.slug, job_id=job.id, group_id=group_id, group_index=gi,
                row_index=row_index, rollout_id=rid, trace=Trace(trace_id=rid))
            for gi in range(group)
            for rid in [f"{job.id}-{row.slug}-{gi}" + (f"-b{batch}" if batch else "")]
        ]
        groups.append(ctx.run_group(taskset, row, runs))
    for runs in await asyncio.gather(*groups):
        job.runs.extend(runs)
    return job


class _Batch:
    def __init__(self, agent: Agent, runtime: DurableProvider, store: TraceStore,
                 limit: asyncio.Semaphore, rollout_timeout: float | None) -> None:
        self.agent = agent
        self.runtime = runtime
        self.store = store
        self.limit = limit
        self.rollout_timeout = rollout_timeout

    async def run_group(self, taskset: Taskset, row: Task, runs: list[Run]) -> list[Run]:
        try:
            async with self.limit:
                task = await taskset.aresolve(row)
                self.runtime.check_task(task)
        except Exception as exc:
            for run in runs:
                _fail(run, "resolving", exc)
            return runs
        for run in runs:
            run.task = task
        await asyncio.gather(*(self._limited(run, task) for run in runs))
        return runs

    async def _limited(self, run: Run, task: Task) -> None:
        async with self.limit:
            await self.rollout(run, task)

    async def rollout(self, run: Run, task: Task) -> None:
        endpoint: Endpoint | None = None
        session: Session | None = None
        phase = "provisioning"
        started = time.time()
        scope: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(self.rollout_timeout) as scope:
                try:
                    opened = await merged_steps.open_rollout(task, run.rollout_id, self.runtime)
                except StepFailed as failed:
                    phase = failed.phase
                    raise failed.cause from None
                endpoint, session, run.prompt = opened.endpoint, opened.session, opened.prompt
                run.bindings = list(session.bindings)
                phase = "agent loop"
                agent_input = AgentInput(
                    endpoint=endpoint, session=session, task=task, prompt=run.prompt,
                    agent=_IN_PROCESS, rollout_id=run.rollout_id, job_id=run.job_id,
                    group_id=run.group_id, timeout_s=self.agent.timeout_s)
                async with agent_step.agent_channel(agent_input) as client:
                    run.trace = await agent_step.execute_agent(self.agent, agent_input, client=client)
                    result = await agent_step.astore_result(run.trace, self.store)
                    run.trace_ref = result.trace_ref
                    phase = "grading"
                    grade_input = GradeInput(endpoint=endpoint, session=session,
                                             answer=run.trace.content, agent_error=result.error)
                    if task.verifier is None:  # the agent's connection grades and ends the session
                        grade = await merged_steps.close_rollout(grade_input, provider=self.runtime,
                                                          client=client)
                        endpoint = None  # released by close_rollout
                    else:  # graded on it too; the session stays parked for the verifier
                        grade = await steps.grade(grade_input, client=client)
                if task.verifier is not None:
                    phase = "verifying"
                    run.trace.extra["actor_grade"] = grade.model_dump(mode="json")
                    grade = await verify_once.verify(VerifyInput(
                        task=task, actor_endpoint=endpoint, actor_session=session,
                        actor_raw=steps.actor_result(grade, run.trace.content, result.error),
                        provider=endpoint.provider, key=run.rollout_id), provider=self.runtime)
                run.grade = grade
                status, run.error_phase, run.error = graded_outcome(result, grade)
                run.status = "errored" if status == "timeout" else status  # a rollout_timeout is "timeout" here
        except TimeoutError as exc:
            if scope is not None and scope.expired():
                _fail(run, phase, TimeoutError(f"rollout timed out after {self.rollout_timeout}s"))
                run.status = "timeout"
            else:
                _fail(run, phase, exc)
        except Exception as exc:
            _fail(run, phase, exc)
        finally:
            run.trace.extra.setdefault("started_at", started)
            if endpoint is not None:
                await self._cleanup(run, endpoint, session)
            if run.trace_ref is not None or run.trace.steps:
                with contextlib.suppress(Exception):
                    run.trace_ref = await self.store.aput(run.trace)

    async def _cleanup(self, run: Run, endpoint: Endpoint, session: Session | None) -> None:
        try:
            await steps.teardown_with(endpoint, session, self.runtime)
        except Exception as exc:  # recorded, never raised: the rollout already has its outcome
            log.warning("teardown of %s failed: %s", run.rollout_id, exc)
            run.trace.extra["teardown_error"] = f"{type(exc).__name__}: {exc}"


def _fail(run: Run, phase: str, exc: BaseException) -> None:
    message = str(exc) or type(exc).__name__
    run.error = f"[{phase}] {message}"
    run.error_phase = phase
    run.status = "failed" if phase in _BEFORE_LAUNCH else "errored"
    if run.trace.status == "running":
        run.trace.status = "error"
        run.trace.stop_reason = "error"
    run.trace.record(Step(source="system", error=run.error, ended_at=time.time()))
