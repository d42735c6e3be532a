"""Activities of the ``Rollout`` workflow: thin wrappers over ``steps/``.

One class built with its dependencies (the worker's queues, the trace store); one pydantic input
per activity; errors mapped at one edge (``failures.map_errors``). Long steps heartbeat from a
background beat, so a killed worker is noticed within the heartbeat timeout and the step retries
elsewhere. ``provision`` decides where the later steps of a rollout run (``Endpoint.task_queue``)
from the provider's locality and this worker's queues. The merged steps of earlier releases'
Rollouts, still scheduled by runs those releases started, live in ``legacy``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from temporalio import activity

from durable_rollouts.activities.admission import report_start
from durable_rollouts.activities.checkpoints import AgentCheckpoints
from durable_rollouts.activities.failures import map_errors
from durable_rollouts.activities.legacy import LegacySteps
from durable_rollouts.activities.watch import RunningAgents
from durable_rollouts.models import Endpoint, Grade, Session
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.run import Run
from durable_rollouts.step_io import (
    AgentInput,
    AgentResult,
    ConnectInput,
    GradeInput,
    ProvisionInput,
    Started,
    StartInput,
    TeardownInput,
    VerifierSession,
    VerifyInput,
)
from durable_rollouts.steps import agent as agent_step
from durable_rollouts.steps import substrate as steps
from durable_rollouts.steps import verifier, verify_once
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.workflows.types import (
    ACT_AGENT,
    ACT_CONNECT,
    ACT_GRADE,
    ACT_PROVISION,
    ACT_START,
    ACT_TEARDOWN,
    ACT_VERIFY,
    ACT_VERIFY_CLOSE,
    ACT_VERIFY_OPEN,
    DEFAULT_TASK_QUEUE,
)

__all__ = ["Queues", "RolloutActivities"]

T = TypeVar("T")

# The background beat of long steps: every BEAT_S, or BEAT_FRACTION of the step's heartbeat
# timeout when that is longer (the agent's 20 s: every 4 s), the first after one interval, so a
# step shorter than that sends no heartbeat (each heartbeat is a write of the workflow's state on
# the server). A step that begins running more than one interval after the server started it
# beats at once: an eagerly dispatched step counts as started before a busy worker gets to run
# it, and its heartbeat timeout runs from then. temporalio sends at most one heartbeat per 80%
# of the timeout (worker.HEARTBEAT_THROTTLE caps that); beating at a fifth of the timeout keeps
# a loop stall of 60% of it inside the timeout.
BEAT_S = 1.0
BEAT_FRACTION = 0.2


def _started_late(info: activity.Info, beat_s: float) -> bool:
    """Whether this attempt began running more than ``beat_s`` after the server started it."""
    started = info.started_time
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - started).total_seconds() > beat_s


@dataclass(frozen=True)
class Queues:
    """The task queues one worker polls.

    Args:
        shared: the queue every worker polls (workflows and global-locality steps).
        host: this host's queue for host-local substrates (subprocesses); None = ``shared``
            (single-host mode, which keeps eager activity dispatch).
        process: this process's queue for in-process substrates; None = ``host``.
    """

    shared: str = DEFAULT_TASK_QUEUE
    host: str | None = None
    process: str | None = None

    def for_locality(self, locality: str) -> str | None:
        if locality == "global":
            return None
        if locality == "host":
            return self.host or self.shared
        return self.process or self.host or self.shared

    @property
    def extra(self) -> list[str]:
        """Queues besides ``shared`` that this worker must also poll (activities only)."""
        return sorted({q for q in (self.host, self.process) if q and q != self.shared})


class RolloutActivities:
    """The rollout steps as activities.

    Args:
        queues: this worker's queues (used by ``provision`` to pin host/process substrates).
        trace_store: where the agent step puts full traces (claim check); default store if None.
        beat_s: interval of the background heartbeat of long steps.
        running: the agent steps this process runs, which its watch's sentinel reports.
    """

    def __init__(self, queues: Queues | None = None, trace_store: TraceStore | None = None,
                 beat_s: float = BEAT_S, running: RunningAgents | None = None) -> None:
        self.queues = queues or Queues()
        self.trace_store = trace_store or TraceStore()
        self.beat_s = beat_s
        self.running = RunningAgents() if running is None else running  # the agent steps this process runs (the watch)
        self.legacy = LegacySteps(self)

    def all(self) -> list[Any]:
        """Every activity: the card's steps, then the merged steps earlier releases scheduled."""
        return [self.provision, self.connect, self.start, self.agent, self.grade, self.verify_open,
                self.verify, self.verify_close, self.teardown, *self.legacy.all()]

    def pin(self, endpoint: Endpoint, provider: Any) -> Endpoint:
        """Route the later steps of ``endpoint`` to this worker's queue for its provider's locality
        (unless the provider chose a queue itself)."""
        if endpoint.task_queue is None:
            endpoint.task_queue = self.queues.for_locality(getattr(provider, "locality", "global"))
        return endpoint

    async def beating(self, step: Awaitable[T],
                      details: Callable[[], tuple[Any, ...]] | None = None) -> T:
        """Await ``step`` while heartbeating every ``beat_s`` (or a fifth of its heartbeat timeout).

        The beats are loop timers (``call_later`` keeps the activity's context), so the step runs
        in this task, as if awaited directly: no task and no wait per beat interval."""
        info = activity.info()
        if info.is_local:  # local activities do not heartbeat: no beat at all
            return await step
        every = self.beat_s
        if info.heartbeat_timeout:
            every = max(every, info.heartbeat_timeout.total_seconds() * BEAT_FRACTION)

        def beat() -> None:
            activity.heartbeat(*(details() if details is not None else ()))

        def tick() -> None:
            nonlocal timer
            beat()
            timer = loop.call_later(every, tick)

        loop = asyncio.get_running_loop()
        if _started_late(info, every):  # its heartbeat timeout has been running
            beat()
        timer = loop.call_later(every, tick)
        try:
            return await step
        finally:
            timer.cancel()

    @staticmethod
    def last_attempt() -> bool:
        """Whether this is the step's last attempt under its retry policy."""
        info = activity.info()
        limit = info.retry_policy.maximum_attempts if info.retry_policy else 0
        return 0 < limit <= info.attempt

    @activity.defn(name=ACT_PROVISION)
    async def provision(self, inp: ProvisionInput) -> Endpoint:
        await report_start(inp.admission)  # fleet-wide admission holds its rate on this start
        with map_errors():
            endpoint = await self.beating(steps.provision(inp))
        return self.pin(endpoint, provider_from_spec(inp.provider))

    @activity.defn(name=ACT_CONNECT)
    async def connect(self, inp: ConnectInput) -> Session:
        with map_errors():
            return await steps.connect(inp)

    @activity.defn(name=ACT_START)
    async def start(self, inp: StartInput) -> dict[str, Any] | Started:
        """The start step; keyed by this run and substrate, so a start replayed after its worker
        died before recording it gets the task it started (``steps.substrate.start``)."""
        info = activity.info()
        with map_errors():
            return await steps.start(inp, start_key=f"{info.workflow_run_id}/{inp.endpoint.key}")

    @activity.defn(name=ACT_AGENT)
    async def agent(self, inp: AgentInput) -> AgentResult:
        """The agent's run on the rollout's session (from its latest checkpoint on a retry)."""
        if inp.open is not None or inp.close:  # an earlier release's merged agent step
            return await self.legacy.agent(inp)
        with map_errors():
            async with self.running.running(activity.info().workflow_id or "", inp.schedule):
                return await self._agent(inp)

    async def _agent(self, inp: AgentInput) -> AgentResult:
        """The agent step proper, listed in this process's watch meanwhile."""
        checkpoints = AgentCheckpoints(inp)
        # a retried attempt resumes from the last checkpoint; fetching it may wait for the
        # workflow's task to leave a dead worker's sticky queue: keep heartbeating meanwhile
        inp = await self.beating(checkpoints.restore(inp), checkpoints.details)
        return await self.beating(
            agent_step.run_agent(inp, agent=load_agent(inp.agent), new_run=Run.for_step,
                                 trace_store=self.trace_store,
                                 checkpointer=checkpoints.save, last_attempt=self.last_attempt()),
            checkpoints.details)

    @activity.defn(name=ACT_GRADE)
    async def grade(self, inp: GradeInput) -> Grade:
        with map_errors():
            return await self.beating(steps.grade(inp, retried=activity.info().attempt > 1))

    @activity.defn(name=ACT_VERIFY_OPEN)
    async def verify_open(self, inp: VerifyInput) -> VerifierSession:
        info = activity.info()
        with map_errors():
            opened = await self.beating(verifier.open_verifier(
                inp, start_key=f"{info.workflow_run_id}/{inp.key}/verifier"))
            if opened.owned:
                self.pin(opened.endpoint, provider_from_spec(inp.provider))
        return opened

    @activity.defn(name=ACT_VERIFY)
    async def verify(self, inp: VerifyInput) -> Grade:
        with map_errors():
            if inp.verifier_session is not None:  # the recorded verify: grade in that session
                return await self.beating(verifier.grade_verifier(inp))
            return await self.beating(verify_once.verify(inp))  # histories before it

    @activity.defn(name=ACT_VERIFY_CLOSE)
    async def verify_close(self, opened: VerifierSession) -> None:
        with map_errors():
            await verifier.close_verifier(opened)

    @activity.defn(name=ACT_TEARDOWN)
    async def teardown(self, inp: TeardownInput) -> None:
        with map_errors():
            await steps.teardown(inp)
