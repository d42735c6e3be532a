"""The direct executor: run a taskset with plain asyncio in one process, no Temporal.

It walks the same plan (``steps.plan``) with the same step functions as the ``Rollout``
workflow: provision, connect, start, agent, grade, [verify_open, verify, verify_close], teardown,
each retried as the plan says (same attempts, same backoff), a gone substrate placed again up to
``max_attempts``, teardown on every path. So the two executors differ only in durability (the
benchmarks compare them). Failures never escape the batch: each becomes a run with a status, an
error and the phase it happened in. ``run.trace.extra["walked"]`` lists the steps in the order
they ran. Imports the steps and sdk modules only; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError, ModelAPIError, SubstrateGoneError
from ..ids import group_id, rollout_id
from ..models import AgentSpec, Endpoint, Grade, ProviderSpec, Session, Step, Task, Trace
from ..runtimes.base import DurableProvider
from ..step_io import (
    AgentInput,
    AgentResult,
    ConnectInput,
    GradeInput,
    ProvisionInput,
    StartInput,
    VerifyInput,
    graded_outcome,
)
from ..steps import agent as agent_step
from ..steps import substrate, verifier
from ..steps.plan import Plan, build_plan, retry_delay
from ..steps.plan import Step as PlanStep
from ..stores.tracestore import TraceStore
from .agents import Agent, as_agent
from .job import Job
from .placement import resolve_placement
from .run import Run
from .taskset_hooks import check_taskset_flags
from .validation import validate_batch

if TYPE_CHECKING:
    from .taskset import Taskset

__all__ = ["run_direct"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_IN_PROCESS = AgentSpec(path="in-process")  # the direct path hands the agent object over as is
_IN_PROCESS_PROVIDER = ProviderSpec(kind="in-process")  # ... and the runtime object too
_BEFORE_LAUNCH = {"resolving", "provisioning", "connecting", "starting task"}
MAX_ATTEMPTS = 3  # substrates per rollout, as the durable path's default ``max_attempts``


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
    ctx = _Batch(agent, runtime, trace_store or TraceStore(), asyncio.Semaphore(max_concurrent),
                 rollout_timeout)
    groups = []
    for row_index, row in enumerate(taskset):  # the durable path's ids (``ids``), so both agree
        runs = [
            Run(task=row, slug=row.slug, job_id=job.id, group_id=group_id(job.id, row_index, batch),
                group_index=gi, row_index=row_index, rollout_id=rid, trace=Trace(trace_id=rid))
            for gi in range(group)
            for rid in [rollout_id(job.id, row.slug, gi, batch)]
        ]
        groups.append(ctx.run_group(taskset, row, runs))
    for runs in await asyncio.gather(*groups):
        job.runs.extend(runs)
    return job


class _Gone(Exception):
    """This substrate is gone in ``phase``: tear down what is left, place the next one."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.phase = phase


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
        """Substrate attempts until one has an outcome (as ``workflows.outcome.run_attempts``)."""
        plan = build_plan(verifier=task.verifier is not None, rollout_timeout_s=self.rollout_timeout,
                          local_steps=True)
        started, lost, walked = time.time(), [], []
        for number in range(1, MAX_ATTEMPTS + 1):
            walk = _Walk(self, run, task, plan, run.rollout_id + (f"-a{number}" if number > 1 else ""),
                         walked)
            try:
                async with asyncio.timeout(self.rollout_timeout):
                    await walk.walk()
            except TimeoutError:
                _fail(run, walk.phase, TimeoutError(f"rollout timed out after {self.rollout_timeout}s"))
                run.status = "timeout"
            except _Gone as gone:
                lost.append(f"attempt {number} ({gone.phase}): {gone}")
                if number < MAX_ATTEMPTS:
                    continue
                _fail(run, gone.phase, SubstrateGoneError(f"substrate gone {MAX_ATTEMPTS} times: "
                                                          + "; ".join(lost)))
            except Exception as exc:
                _fail(run, walk.phase, exc)
            break
        run.attempts = number
        if lost and run.status == "succeeded":
            run.trace.extra["lost_substrates"] = lost
        run.trace.extra.setdefault("started_at", started)
        run.trace.extra["walked"] = walked
        if run.trace_ref is not None or run.trace.steps:
            with contextlib.suppress(Exception):
                run.trace_ref = await self.store.aput(run.trace)


class _Walk:
    """One substrate's walk of the plan; what its steps returned so far."""

    def __init__(self, batch: _Batch, run: Run, task: Task, plan: Plan, key: str,
                 walked: list[str]) -> None:
        self.batch, self.run, self.task, self.plan, self.key = batch, run, task, plan, key
        self.walked = walked  # every step's name as it starts, across the rollout's substrates
        self.phase = "provisioning"
        self.endpoint: Endpoint | None = None
        self.session: Session | None = None
        self.agent: AgentResult | None = None
        self.grade: Grade | None = None

    async def walk(self) -> None:
        try:
            for step in self.plan.steps:
                self.phase = step.phase
                await getattr(self, f"_{step.step}")(step)  # _provision, _connect, ...
            assert self.agent is not None and self.grade is not None
            self.run.grade = self.grade
            status, self.run.error_phase, self.run.error = graded_outcome(self.agent, self.grade)
            self.run.status = "errored" if status == "timeout" else status
        finally:
            if self.endpoint is not None:
                await asyncio.shield(self._teardown())

    async def _step(self, step: PlanStep, call: Callable[[int], Awaitable[T]]) -> T:
        """``call(attempt)`` under the step's limit, retried as the plan says; a config error, a
        gone substrate and a final model API error are not retried."""
        self.walked.append(step.step)
        for attempt in range(1, step.attempts + 1):
            try:
                async with asyncio.timeout(step.start_to_close_s):
                    return await call(attempt)
            except (ConfigError, SubstrateGoneError):
                raise
            except ModelAPIError as exc:
                if not exc.retryable or attempt == step.attempts:
                    raise
                pause = exc.retry_after_s if exc.retry_after_s is not None else retry_delay(attempt)
            except Exception:
                if attempt == step.attempts:
                    raise
                pause = retry_delay(attempt)
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _gone_guard(self, step: PlanStep, call: Callable[[int], Awaitable[T]]) -> T:
        try:
            return await self._step(step, call)
        except SubstrateGoneError as exc:
            raise _Gone(step.phase, exc) from None

    async def _provision(self, step: PlanStep) -> None:
        inp = ProvisionInput(key=self.key, task=self.task, provider=_IN_PROCESS_PROVIDER)
        self.endpoint = await self._gone_guard(
            step, lambda _: substrate.provision(inp, provider=self.batch.runtime))

    async def _connect(self, step: PlanStep) -> None:
        assert self.endpoint is not None
        self.session = await self._gone_guard(
            step, lambda _: substrate.connect(ConnectInput(endpoint=self.endpoint)))

    async def _start(self, step: PlanStep) -> None:
        assert self.endpoint is not None and self.session is not None
        inp = StartInput(endpoint=self.endpoint, session=self.session, task=self.task, with_session=True)
        started = await self._gone_guard(step, lambda _: substrate.start(inp))
        self.session, self.run.prompt = started.session, started.prompt
        self.run.bindings = list(started.session.bindings)

    async def _agent(self, step: PlanStep) -> None:
        """The agent step; its failures are graded, except a gone substrate and a config error."""
        run = self.run
        inp = AgentInput(endpoint=self.endpoint, session=self.session, task=self.task, prompt=run.prompt,
                         agent=_IN_PROCESS, rollout_id=run.rollout_id, job_id=run.job_id,
                         group_id=run.group_id, group_index=run.group_index, row_index=run.row_index,
                         retry=run.attempt - 1, timeout_s=self.batch.agent.timeout_s)

        async def attempt(_: int) -> AgentResult:
            async with agent_step.agent_channel(inp) as client:
                run.trace = await agent_step.execute_agent(self.batch.agent, inp, new_run=Run.for_step,
                                                           client=client)
            result = await agent_step.astore_result(run.trace, self.batch.store)
            run.trace_ref = result.trace_ref
            return result

        try:
            self.agent = await self._gone_guard(step, attempt)
        except (_Gone, ConfigError):
            raise
        except Exception as exc:  # infrastructure that outlasted the step's attempts: graded
            self.agent = AgentResult(status="error", error=f"{type(exc).__name__}: {exc}")
            _record(run, f"[{step.phase}] {self.agent.error}")

    async def _grade(self, step: PlanStep) -> None:
        assert self.endpoint is not None and self.session is not None and self.agent is not None
        inp = GradeInput(endpoint=self.endpoint, session=self.session, answer=self.agent.content,
                         agent_error=self.agent.error)
        self.grade = await self._gone_guard(step, lambda n: substrate.grade(inp, retried=n > 1))

    async def _verify(self, step: PlanStep) -> None:
        """verify_open -> verify -> verify_close; a gone verifier is placed again, the agent never
        runs again (as the workflow's ``_verify``)."""
        assert self.agent is not None and self.grade is not None and self.endpoint is not None
        self.run.trace.extra["actor_grade"] = self.grade.model_dump(mode="json")
        raw = substrate.actor_result(self.grade, self.agent.content, self.agent.error)
        runtime, last = self.batch.runtime, ""
        for v in range(1, MAX_ATTEMPTS + 1):
            vin = VerifyInput(task=self.task, actor_endpoint=self.endpoint, actor_session=self.session,
                              actor_raw=raw, provider=_IN_PROCESS_PROVIDER,
                              key=self.key + (f"-v{v}" if v > 1 else ""))
            opened = None
            try:
                opened = await self._step(self.plan["verify_open"],
                                          lambda _: verifier.open_verifier(vin, provider=runtime))
                graded = vin.model_copy(update={"verifier_endpoint": opened.endpoint,
                                                "verifier_session": opened.session})
                self.grade = await self._step(step, lambda _: verifier.grade_verifier(graded))
                return
            except SubstrateGoneError as exc:
                last = str(exc)
            finally:
                if opened is not None:
                    closing = opened
                    with contextlib.suppress(Exception):
                        await self._step(self.plan["verify_close"],
                                         lambda _: verifier.close_verifier(closing, provider=runtime))
        raise RuntimeError(f"verifier substrate gone {MAX_ATTEMPTS} times: {last}")

    async def _teardown(self) -> None:
        assert self.endpoint is not None
        endpoint, session = self.endpoint, self.session
        try:
            await self._step(self.plan.teardown,
                             lambda _: substrate.teardown_with(endpoint, session, self.batch.runtime))
        except Exception as exc:  # recorded, never raised: the rollout already has its outcome
            log.warning("teardown of %s failed: %s", self.run.rollout_id, exc)
            self.run.trace.extra["teardown_error"] = f"{type(exc).__name__}: {exc}"


def _record(run: Run, error: str) -> None:
    run.trace.record(Step(source="system", error=error, ended_at=time.time()))


def _fail(run: Run, phase: str, exc: BaseException) -> None:
    message = str(exc) or type(exc).__name__
    run.error = f"[{phase}] {message}"
    run.error_phase = phase
    run.status = "failed" if phase in _BEFORE_LAUNCH else "errored"
    if run.trace.status == "running":
        run.trace.status = "error"
        run.trace.stop_reason = "error"
    _record(run, run.error)
