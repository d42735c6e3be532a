"""The ``Rollout`` child workflow: provision -> connect -> start -> agent -> grade -> [verify] -> teardown.

Every Rollout of this release runs the card's steps, each a separately named activity in its
history, as the plan (``plan.build_plan``) lists them; the workflow walks that plan. Runs that
earlier releases started (``RolloutInput.layout`` below ``CARD_LAYOUT``) run their own shape,
frozen in ``legacy``, chosen once at the start of ``run``.

The workflow owns the substrate: provision returns its endpoint, and every later step runs
where the substrate is reachable (``plan``: locally on this worker, or on the provisioning
worker's own queue). Ordinary failures never fail the workflow: they come back as a
``RolloutResult`` with ``status`` and ``error_phase`` so the parent can count them. A gone
substrate (connection refused, unknown session, a substrate queue nobody polls any more) tears
down what is left and starts a new rollout attempt, up to ``max_attempts``; every attempt's
error is recorded. A gone verifier re-places the verifier only. Teardown always runs, also on
cancel.

Durable agent turns: the agent activity records checkpoints with the ``checkpoint`` update
(``checkpoints.AgentTurns``); a retried attempt fetches the latest with ``latest_checkpoint``,
and a fresh schedule of the agent step gets it in its input. Deterministic: imports only stdlib,
temporalio and the pure models; activities are referenced by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.admission import SIG_ADMITTED, AdmissionTicket
    from durable_rollouts.models import Endpoint, Grade, RolloutResult, Session
    from durable_rollouts.step_io import (
        AgentInput,
        AgentResult,
        Checkpoint,
        CheckpointFence,
        ConnectInput,
        GradeInput,
        ProvisionInput,
        Started,
        StartInput,
        TeardownInput,
        VerifierSession,
        VerifyInput,
    )
    from durable_rollouts.workflows import outcome
    from durable_rollouts.workflows.admission import admitted
    from durable_rollouts.workflows.checkpoints import AgentTurns
    from durable_rollouts.workflows.failures import (
        STEP_FAILURES,
        failure_message,
        is_cancelled,
        is_config_error,
        is_heartbeat_timeout,
        is_queue_lost,
        is_substrate_gone,
        is_timeout,
    )
    from durable_rollouts.workflows.legacy import LegacyRollout
    from durable_rollouts.workflows.outcome import KEY_STATUS, Errored, SubstrateGone
    from durable_rollouts.workflows.plan import RolloutPlan, StepOptions, build_plan
    from durable_rollouts.workflows.queue_probe import queue_polled
    from durable_rollouts.workflows.worker_watch import AgentLost
    from durable_rollouts.workflows.types import (
        AGENT_HEARTBEAT_S,
        CARD_LAYOUT,
        SIG_AGENT_WORKER_LOST,
        UPD_CHECKPOINT,
        UPD_LATEST_CHECKPOINT,
        RolloutInput,
    )

__all__ = ["CardRollout", "Rollout"]

# Fresh schedules of the agent step after every attempt timed out on heartbeats (a lost worker):
# a hung (e.g. SIGSTOPped) worker's open long polls swallow retries until they expire (~70 s),
# so all attempts can be spent in ~40 s.
AGENT_LOST_WORKER_ROUNDS = 3
# Teardown on a substrate queue that just went unpolled: wait this long, not the full queue
# timeout (its worker is most likely gone; the orphan sweep reaps what it left).
LOST_QUEUE_TEARDOWN = timedelta(seconds=5)
# Cheap steps of a pinned substrate run as local activities beside it (see _local_beside_substrate).
PATCH_LOCAL_BESIDE_SUBSTRATE = "rollout-local-steps-beside-substrate"


@dataclass
class _Attempt:
    """What one rollout attempt (one substrate) has so far."""

    inp: RolloutInput
    plan: RolloutPlan
    number: int
    key: str
    endpoint: Endpoint | None = None
    session: Session | None = None
    prompt: dict[str, Any] = field(default_factory=dict)
    agent: AgentResult | None = None
    grade: Grade | None = None
    queue_lost: bool = False
    ticket: AdmissionTicket | None = None  # fleet-wide admission: this attempt's ticket


def _short(heartbeat: timedelta | None) -> timedelta:
    """The agent step's heartbeat timeout after its worker was lost: at most the unwatched one."""
    unwatched = timedelta(seconds=AGENT_HEARTBEAT_S)
    return unwatched if heartbeat is None else min(heartbeat, unwatched)


class _WorkerLost(Exception):
    """The worker running this agent schedule stopped beating (``SIG_AGENT_WORKER_LOST``)."""


class CardRollout(AgentTurns):
    """The card's steps, walked from the plan; the present shape of every new Rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.granted: set[str] = set()  # admission tickets granted (the ``admitted`` signal)
        self.lost_agents: dict[int, str] = {}  # agent schedule -> its dead worker (the watch)
        self._ticket: AdmissionTicket | None = None

    def _patched(self, patch_id: str) -> bool:
        return True  # every patch of earlier releases is part of this shape

    async def run(self, inp: RolloutInput) -> RolloutResult:
        plan = build_plan(inp)
        self._inp = inp
        self._queue = inp.task_queue  # from the input, not workflow.info(): replays run elsewhere
        if inp.search_attributes and not inp.status_at_start:
            workflow.upsert_search_attributes([KEY_STATUS.value_set("running")])
        try:
            result = await self._attempts(inp, plan)
        except asyncio.CancelledError:
            if inp.search_attributes:
                workflow.upsert_search_attributes([KEY_STATUS.value_set("cancelled")])
            raise
        if inp.search_attributes:
            workflow.upsert_search_attributes(outcome.final_attributes(result))
        return result

    async def _attempts(self, inp: RolloutInput, plan: RolloutPlan) -> RolloutResult:
        base_key = workflow.info().workflow_id  # the substrate key: this child's id, per attempt

        def attempt(number: int) -> Awaitable[RolloutResult]:
            self._attempt = number
            return self._walk(_Attempt(inp, plan, number, base_key if number == 1 else f"{base_key}-a{number}",
                                       ticket=self._ticket))

        admit = self._admitted if inp.admission is not None else None
        return await outcome.run_attempts(inp, attempt, lambda: self._last_phase, admit)

    @contextlib.asynccontextmanager
    async def _admitted(self, number: int) -> AsyncIterator[None]:
        """Hold attempt ``number``'s admission ticket (``workflows.admission``)."""
        self._attempt = number
        async with admitted(self._inp, number, self.granted, self._waiting) as ticket:
            self._ticket = ticket
            try:
                yield
            finally:
                self._ticket = None

    def _waiting(self, waiting: bool) -> None:
        """Show the wait for admission: the phase, the Web UI's current details, and
        RolloutsStatus ``waiting`` meanwhile."""
        if waiting:
            self._phase = "waiting for admission"
        workflow.set_current_details("waiting for admission (fleet-wide limits of its runtime)"
                                     if waiting else "")  # the Web UI's details: no command
        if self._inp.search_attributes:
            workflow.upsert_search_attributes([KEY_STATUS.value_set("waiting" if waiting else "running")])

    # -- one attempt: the walk ----------------------------------------------------------------

    async def _walk(self, a: _Attempt) -> RolloutResult:
        """Run the plan's steps in order on one substrate; teardown runs on every path."""
        try:
            for step in a.plan.steps:
                self._phase = self._last_phase = step.phase
                await getattr(self, f"_{step.step}")(step, a)  # _provision, _connect, ...
            assert a.agent is not None and a.grade is not None
            return outcome.graded(a.inp, a.agent, a.grade)
        except STEP_FAILURES as err:
            if is_cancelled(err):
                raise asyncio.CancelledError() from err
            phase = self._last_phase
            if is_substrate_gone(err):
                a.queue_lost = is_queue_lost(err)
                raise SubstrateGone(phase, failure_message(err)) from None
            status = "failed" if phase in outcome.BEFORE_LAUNCH else "errored"
            return outcome.result(a.inp, status, error=f"[{phase}] {failure_message(err)}",
                                  error_phase=phase)
        except Errored as err:
            return outcome.result(a.inp, "errored", error=str(err), error_phase=err.phase)
        finally:
            if a.endpoint is not None:
                self._phase = "teardown"
                await self._teardown(a)

    async def _provision(self, step: StepOptions, a: _Attempt) -> None:
        inp = ProvisionInput(key=a.key, task=a.inp.task, provider=a.inp.provider, admission=a.ticket)
        a.endpoint = await self._call(step, inp, Endpoint, None, a.plan)

    async def _connect(self, step: StepOptions, a: _Attempt) -> None:
        assert a.endpoint is not None
        a.session = await self._call(step, ConnectInput(endpoint=a.endpoint), Session, a.endpoint, a.plan)

    async def _start(self, step: StepOptions, a: _Attempt) -> None:
        assert a.endpoint is not None and a.session is not None
        inp = StartInput(endpoint=a.endpoint, session=a.session, task=a.inp.task, with_session=True)
        started: Started = await self._call(step, inp, Started, a.endpoint, a.plan)
        a.session, a.prompt = started.session, started.prompt

    async def _agent(self, step: StepOptions, a: _Attempt) -> None:
        """The agent step; its failures are graded (best effort), except a gone substrate, a
        cancellation and an agent that cannot be built."""
        inp = a.inp
        agent_input = AgentInput(
            endpoint=a.endpoint, session=a.session, task=inp.task, prompt=a.prompt, agent=inp.agent,
            rollout_id=inp.rollout_id, job_id=inp.job_id, group_id=inp.group_id,
            group_index=inp.group_index, row_index=inp.row_index, retry=inp.retry,
            policy_version=inp.policy.version if inp.policy else None,
            policy_endpoint=inp.policy.endpoint if inp.policy else None)
        self._checkpoint = None  # a new substrate (rollout attempt): older checkpoints do not apply
        lost = 0
        while True:
            # Each schedule fences off the earlier ones and starts from the latest checkpoint.
            agent_input = agent_input.model_copy(update={
                "schedule": self._fresh_agent_schedule(), "checkpoint": self._checkpoint})
            try:
                a.agent = await self._watched_agent(step, agent_input, a)
                return
            except _WorkerLost as err:
                pinned = a.endpoint is not None and a.endpoint.task_queue not in (None, self._queue)
                if pinned or inp.ephemeral:  # the substrate lived on the dead worker
                    raise SubstrateGone(step.phase, str(err)) from None
                if lost >= AGENT_LOST_WORKER_ROUNDS:
                    a.agent = AgentResult(status="error", error=str(err))
                    return
                lost += 1
                workflow.logger.warning("rollout %s: %s; scheduling it again", inp.rollout_id, err)
                # A hung worker's open polls may swallow the next schedule (it counts as started
                # there, and that worker's watch has already reported): this rollout's agent
                # step notices by its own heartbeat from now on, as without the watch.
                step = dataclasses.replace(step, heartbeat=_short(step.heartbeat))
                continue
            except STEP_FAILURES as err:
                if is_substrate_gone(err) or is_cancelled(err):
                    raise
                if is_config_error(err):  # the agent cannot even be built: nothing to grade
                    raise Errored(step.phase, failure_message(err)) from None
                if is_heartbeat_timeout(err) and lost < AGENT_LOST_WORKER_ROUNDS:
                    lost += 1
                    workflow.logger.warning("rollout %s: agent lost its worker on every attempt; "
                                            "scheduling it again (%d)", inp.rollout_id, lost)
                    continue
                a.agent = AgentResult(status="timeout" if is_timeout(err) else "error",
                                      error=failure_message(err))
                return

    async def _watched_agent(self, step: StepOptions, agent_input: AgentInput,
                             a: _Attempt) -> AgentResult:
        """The agent step; with the worker watch on, cut short when its worker is signalled dead
        (``workflows.worker_watch``): its activity is cancelled and ``_WorkerLost`` raised."""
        call = self._call(step, agent_input, AgentResult, a.endpoint, a.plan)
        if not a.inp.worker_watch:
            return await call
        schedule = agent_input.schedule
        running = asyncio.ensure_future(call)
        await workflow.wait_condition(lambda: running.done() or schedule in self.lost_agents)
        if running.done():
            return running.result()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError, *STEP_FAILURES):
            await running
        raise _WorkerLost(f"the worker of its agent step died ({self.lost_agents[schedule]})")

    async def _grade(self, step: StepOptions, a: _Attempt) -> None:
        assert a.endpoint is not None and a.session is not None and a.agent is not None
        inp = GradeInput(endpoint=a.endpoint, session=a.session, answer=a.agent.content,
                         agent_error=a.agent.error)
        a.grade = await self._call(step, inp, Grade, a.endpoint, a.plan)

    async def _verify(self, step: StepOptions, a: _Attempt) -> None:
        """open the verifier (its session recorded) -> grade in it -> close; a gone verifier is
        placed again (up to ``max_attempts``), the agent never runs again."""
        assert a.endpoint is not None and a.session is not None
        assert a.agent is not None and a.grade is not None
        raw = outcome.actor_raw(a.grade, a.agent)
        last = ""
        for v in range(1, a.inp.max_attempts + 1):
            vin = VerifyInput(task=a.inp.task, actor_endpoint=a.endpoint, actor_session=a.session,
                              actor_raw=raw, provider=a.inp.provider,
                              key=a.key + (f"-v{v}" if v > 1 else ""))
            opened: VerifierSession | None = None
            try:
                # placed from the actor's worker: a verifier on the actor's own server reaches it
                opened = await self._call(a.plan["verify_open"], vin, VerifierSession, a.endpoint,
                                          a.plan)
                vin = vin.model_copy(update={"verifier_endpoint": opened.endpoint,
                                             "verifier_session": opened.session})
                a.grade = await self._call(step, vin, Grade, opened.endpoint, a.plan)
                return
            except STEP_FAILURES as err:
                if is_cancelled(err):
                    raise
                if not is_substrate_gone(err):
                    raise Errored(step.phase, failure_message(err)) from None
                last = failure_message(err)  # only the verifier is placed again
            finally:
                if opened is not None:
                    with contextlib.suppress(*STEP_FAILURES):
                        await self._call(a.plan["verify_close"], opened, None, opened.endpoint, a.plan)
        raise Errored(step.phase, f"verifier substrate gone {a.inp.max_attempts} times: {last}")

    async def _teardown(self, a: _Attempt) -> None:
        # Runs also after cancellation: a fresh activity started here is not cancelled.
        assert a.endpoint is not None
        step, inp = a.plan.teardown, TeardownInput(endpoint=a.endpoint, session=a.session)
        try:
            lost = min(LOST_QUEUE_TEARDOWN, a.plan.queue_timeout) if a.queue_lost else None
            await self._call(step, inp, None, a.endpoint, a.plan, queue_timeout=lost)
        except STEP_FAILURES as err:
            workflow.logger.warning("teardown of %s failed: %s", a.endpoint.key, failure_message(err))
        except asyncio.CancelledError:
            workflow.logger.warning("teardown of %s cancelled", a.endpoint.key)

    async def _call(self, step: StepOptions, arg: Any, result_type: type | None,
                    endpoint: Endpoint | None, plan: RolloutPlan,
                    queue_timeout: timedelta | None = None) -> Any:
        """Run ``step``: locally when allowed and the substrate is reachable from this worker,
        else as an activity on the substrate's queue (or the workflow's, before provision). A
        substrate's queue that did not pick the step up in time is probed: busy waits again,
        unpolled raises (lost)."""
        queue = endpoint.task_queue if endpoint is not None else None
        pinned = queue is not None and queue != self._queue
        if step.local and (not pinned or self._local_beside_substrate()):
            return await workflow.execute_local_activity(
                step.activity, arg, result_type=result_type, summary=step.step,
                start_to_close_timeout=step.start_to_close, retry_policy=step.retry)
        while True:
            try:
                return await workflow.execute_activity(
                    step.activity, arg, result_type=result_type, summary=step.step,
                    task_queue=queue if pinned else None, start_to_close_timeout=step.start_to_close,
                    heartbeat_timeout=step.heartbeat, retry_policy=step.retry,
                    schedule_to_start_timeout=(queue_timeout or plan.queue_timeout) if pinned else None)
            except STEP_FAILURES as err:
                # Not picked up in time: a busy queue (its worker answers the probe) waits again.
                if not (pinned and queue_timeout is None and is_queue_lost(err)
                        and await queue_polled(queue or "", plan.queue_timeout)):
                    raise
                workflow.logger.info("%s waits on busy queue %s", step.step, queue)

    def _local_beside_substrate(self) -> bool:
        """Whether a cheap step of a pinned substrate runs as a local activity (this release).

        A Rollout stays on the worker that provisioned its substrate (its workflow task is sticky
        there, and provision ran beside it), so its cheap steps reach the substrate from right
        here, as on one worker: no activity round trip on the substrate's queue. If the workflow
        moved to another worker (the first one died, or evicted it), the step finds the substrate
        gone and the rollout reprovisions, as it would on a lost queue. Rollouts started by
        earlier releases keep their pinned activities (decided once, at the first such step).
        """
        if self._beside is None:
            self._beside = workflow.patched(PATCH_LOCAL_BESIDE_SUBSTRATE)
        return self._beside

    _queue = ""
    _last_phase = "provisioning"
    _beside: bool | None = None


@workflow.defn(name="Rollout")
class Rollout:
    """One rollout of one task with one agent on one substrate."""

    def __init__(self) -> None:
        self._shape: CardRollout | LegacyRollout = CardRollout()

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        if inp.layout < CARD_LAYOUT:  # started by an earlier release: its own shape, frozen
            self._shape = LegacyRollout()
        return await self._shape.run(inp)

    @workflow.query
    def phase(self) -> dict[str, Any]:
        return self._shape.phase()

    @workflow.signal(name=SIG_ADMITTED)
    def admitted(self, ticket: str) -> None:
        """The admission workflow granted ``ticket`` (``workflows.admission``)."""
        if isinstance(self._shape, CardRollout):
            self._shape.granted.add(ticket)

    @workflow.signal(name=SIG_AGENT_WORKER_LOST)
    def agent_worker_lost(self, lost: AgentLost) -> None:
        """The worker watch: the worker running agent schedule ``lost.schedule`` died."""
        if isinstance(self._shape, CardRollout):
            self._shape.lost_agents[lost.schedule] = lost.worker or "a worker"

    @workflow.update(name=UPD_CHECKPOINT)
    def checkpoint(self, checkpoint: Checkpoint) -> int:
        """Keep the agent's newest checkpoint (a delta of trace steps); returns the step count."""
        return self._shape.keep(checkpoint)

    @checkpoint.validator
    def _check_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._shape.check(checkpoint)

    @workflow.update(name=UPD_LATEST_CHECKPOINT)
    def latest_checkpoint(self, fence: CheckpointFence) -> Checkpoint | None:
        """The newest checkpoint, for a retried agent attempt (which fences off older ones)."""
        return self._shape.latest(fence)

    @latest_checkpoint.validator
    def _check_latest(self, fence: CheckpointFence) -> None:
        self._shape.check_fence(fence)
