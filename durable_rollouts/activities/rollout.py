"""Activities of the ``Rollout`` workflow: thin wrappers over ``durable_rollouts.sdk.steps``.

One class built with its dependencies (the worker's queues, the trace store); one pydantic input
per activity; errors mapped at one edge (``failures.map_errors``). Long steps heartbeat from a
background beat, so a killed worker is noticed within the heartbeat timeout and the step retries
elsewhere. ``provision`` decides where the later steps of a rollout run (``Endpoint.task_queue``)
from the provider's locality and this worker's queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from temporalio import activity

from durable_rollouts.activities.checkpoints import AgentCheckpoints
from durable_rollouts.activities.failures import map_errors, map_step_errors
from durable_rollouts.activities.parked import PARKED, release_quietly
from durable_rollouts.errors import ConfigError, ModelAPIError, SubstrateGoneError
from durable_rollouts.models import (
    AgentInput,
    AgentResult,
    ConnectInput,
    Endpoint,
    Grade,
    GradeInput,
    Opened,
    ProvisionInput,
    Session,
    StartInput,
    TeardownInput,
    VerifierSession,
    VerifyInput,
)
from durable_rollouts.sdk import steps, verifier, verify_once
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.providers import provider_from_spec
from durable_rollouts.sdk.tracestore import TraceStore
from durable_rollouts.workflows.types import (
    ACT_AGENT,
    ACT_CLOSE,
    ACT_CONNECT,
    ACT_GRADE,
    ACT_OPEN,
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

# The background beat of long steps: every BEAT_S, the first after BEAT_S, so a step shorter
# than that sends no heartbeat (each heartbeat is a write of the workflow's state on the server).
# A step that begins running more than BEAT_S after the server started it beats at once: an
# eagerly dispatched step counts as started before a busy worker gets to run it, and its
# heartbeat timeout runs from then. The worker sends at most one heartbeat per 2 s
# (worker.HEARTBEAT_THROTTLE); beating at half that keeps a loop stall of ~3 s inside the
# agent's 5 s heartbeat timeout. One source only: the agent step used to beat twice as often
# (steps' own beat as well), each beat an asyncio task and a payload-converter copy in temporalio.
BEAT_S = 1.0


def _started_late(info: activity.Info, beat_s: float) -> bool:
    """Whether this attempt began running more than ``beat_s`` after the server started it."""
    started = info.started_time
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - started).total_seconds() > beat_s


def _retried(exc: Exception) -> bool:
    """Whether Temporal retries an agent step that raised ``exc`` (attempts left aside)."""
    return not (isinstance(exc, ModelAPIError) and not exc.retryable)


def _handed_back(result: AgentResult, opened: Opened) -> AgentResult:
    """``result`` of a one-step rollout, with its substrate when it is not graded (so still up):
    the workflow's close step then grades it and tears it down."""
    return result if result.grade is not None else result.model_copy(update={"opened": opened})


async def _grade_failed(inp: AgentInput, opened: Opened, error: str) -> AgentResult:
    """An agent failure that ends a one-step rollout, graded and torn down here (best effort,
    ``close_after_agent`` on a new connection)."""
    failed = AgentResult(status="error", error=error)
    return _handed_back(await steps.close_after_agent(inp.on(opened), failed), opened)


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
    """

    def __init__(self, queues: Queues | None = None, trace_store: TraceStore | None = None,
                 beat_s: float = BEAT_S) -> None:
        self.queues = queues or Queues()
        self.trace_store = trace_store or TraceStore()
        self.beat_s = beat_s

    def all(self) -> list[Any]:
        return [self.provision, self.connect, self.start, self.agent, self.grade, self.verify,
                self.teardown, self.verify_open, self.verify_close, self.open, self.grade_teardown]

    def _pin(self, endpoint: Endpoint, provider: Any) -> Endpoint:
        """Route the later steps of ``endpoint`` to this worker's queue for its provider's locality
        (unless the provider chose a queue itself)."""
        if endpoint.task_queue is None:
            endpoint.task_queue = self.queues.for_locality(getattr(provider, "locality", "global"))
        return endpoint

    async def _beating(self, step: Awaitable[T],
                       details: Callable[[], tuple[Any, ...]] | None = None) -> T:
        """Await ``step`` while heartbeating every ``beat_s``.

        The beats are loop timers (``call_later`` keeps the activity's context), so the step runs
        in this task, as if awaited directly: no task and no wait per beat interval."""
        info = activity.info()
        if info.is_local:  # local activities do not heartbeat: no beat at all
            return await step

        def beat() -> None:
            activity.heartbeat(*(details() if details is not None else ()))

        def tick() -> None:
            nonlocal timer
            beat()
            timer = loop.call_later(self.beat_s, tick)

        loop = asyncio.get_running_loop()
        if _started_late(info, self.beat_s):  # its heartbeat timeout has been running
            beat()
        timer = loop.call_later(self.beat_s, tick)
        try:
            return await step
        finally:
            timer.cancel()

    @activity.defn(name=ACT_PROVISION)
    async def provision(self, inp: ProvisionInput) -> Endpoint:
        with map_errors():
            endpoint = await self._beating(steps.provision(inp))
        return self._pin(endpoint, provider_from_spec(inp.provider))

    @activity.defn(name=ACT_OPEN)
    async def open(self, inp: ProvisionInput) -> Opened:
        """provision -> connect -> start in one step (a fast local substrate)."""
        provider = provider_from_spec(inp.provider)
        with map_step_errors():
            opened = await self._beating(steps.open_rollout(inp.task, inp.key, provider))
        self._pin(opened.endpoint, provider)
        return opened

    @activity.defn(name=ACT_CONNECT)
    async def connect(self, inp: ConnectInput) -> Session:
        with map_errors():
            session = await steps.connect(inp)
        return session

    @activity.defn(name=ACT_START)
    async def start(self, inp: StartInput) -> dict[str, Any]:
        with map_errors():
            prompt = await steps.start(inp)
        return prompt

    @activity.defn(name=ACT_AGENT)
    async def agent(self, inp: AgentInput) -> AgentResult:
        """The agent's run; with ``inp.close`` (a substrate that dies with this worker) also its
        grade and teardown, over the agent's channel."""
        with map_errors():
            checkpoints = AgentCheckpoints(inp)
            # a retried attempt resumes from the last checkpoint; fetching it may wait for the
            # workflow's task to leave a dead worker's sticky queue: keep heartbeating meanwhile
            inp = await self._beating(checkpoints.restore(inp), checkpoints.details)
            info = activity.info()
            limit = info.retry_policy.maximum_attempts if info.retry_policy else 0
            last = 0 < limit <= info.attempt
            if inp.open is not None:
                return await self._open_and_run(inp, checkpoints, last)
            result = await self._beating(
                steps.run_agent(inp, trace_store=self.trace_store, checkpointer=checkpoints.save,
                                last_attempt=last),
                checkpoints.details)
        return result

    async def _open_and_run(self, inp: AgentInput, checkpoints: AgentCheckpoints,
                            last: bool) -> AgentResult:
        """Layout 4: open the substrate (or claim the one an earlier attempt parked), run the
        agent, grade and tear down. The substrate is this step's own (the workflow does not
        know it): it is parked for a retry, torn down when the step ends for good, and an agent
        failure that ends it is graded here, best effort, as the workflow grades one otherwise."""
        assert inp.open is not None
        agent = load_agent(inp.agent)  # a ConfigError before anything is opened
        opened, client = PARKED.claim(inp.open.key), None
        if opened is None:
            if inp.checkpoint is not None:  # the session it checkpointed lived in another process
                raise SubstrateGoneError(f"substrate {inp.open.key} is gone with the worker of an "
                                         "earlier attempt")
            with map_step_errors():  # the agent then works on the connection that started it
                opened, client = await self._beating(steps.open_channel(
                    inp.task, inp.open.key, provider_from_spec(inp.open.provider)), checkpoints.details)
        try:
            result = await self._beating(
                steps.run_agent(inp.on(opened), trace_store=self.trace_store,
                                checkpointer=checkpoints.save, last_attempt=last, agent=agent,
                                client=client),
                checkpoints.details)
        except (asyncio.CancelledError, SubstrateGoneError, ConfigError):
            await asyncio.shield(release_quietly(opened))
            raise
        except Exception as exc:
            if not last and _retried(exc):
                PARKED.park(inp.open.key, opened)
                raise
            return await _grade_failed(inp, opened, str(exc) or type(exc).__name__)
        return _handed_back(result, opened)

    @activity.defn(name=ACT_GRADE)
    async def grade(self, inp: GradeInput) -> Grade:
        with map_errors():
            grade = await self._beating(steps.grade(inp))
        return grade

    @activity.defn(name=ACT_VERIFY_OPEN)
    async def verify_open(self, inp: VerifyInput) -> VerifierSession:
        with map_errors():
            opened = await self._beating(verifier.open_verifier(inp))
            if opened.owned:
                self._pin(opened.endpoint, provider_from_spec(inp.provider))
        return opened

    @activity.defn(name=ACT_VERIFY)
    async def verify(self, inp: VerifyInput) -> Grade:
        with map_errors():
            if inp.verifier_session is not None:  # the recorded verify: grade in that session
                grade = await self._beating(verifier.grade_verifier(inp))
            else:
                grade = await self._beating(verify_once.verify(inp))
        return grade

    @activity.defn(name=ACT_VERIFY_CLOSE)
    async def verify_close(self, opened: VerifierSession) -> None:
        with map_errors():
            await verifier.close_verifier(opened)

    @activity.defn(name=ACT_CLOSE)
    async def grade_teardown(self, inp: GradeInput) -> Grade:
        """grade -> teardown in one step (a substrate that dies with its worker)."""
        with map_errors():
            grade = await self._beating(steps.close_rollout(inp))
        return grade

    @activity.defn(name=ACT_TEARDOWN)
    async def teardown(self, inp: TeardownInput) -> None:
        with map_errors():
            await steps.teardown(inp)
