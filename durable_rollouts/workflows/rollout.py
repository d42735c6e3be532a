"""The ``Rollout`` child workflow: provision -> connect -> start -> agent -> grade -> [verify] -> teardown.

A fast local substrate (``RolloutInput.local_steps``) opens with one merged step, ``open``
(provision -> connect -> start), and one that dies with its worker closes with one,
``grade_teardown``; both in the merged-steps layout, which a parent names in the child's input
(``RolloutInput.layout`` >= 2) and an older run took from the ``rollout-v2-merged-steps`` patch
(``PATCH_V2``). In layout 3 the agent step of such a substrate grades and tears down itself, and
``grade_teardown`` runs only when it could not grade. In layout 4 (this release's parents) the
agent step also opens it when the parent says it is ephemeral and the task has no verifier: the
rollout is one activity (``AgentInput.open``).

Deterministic: imports only stdlib, temporalio, pydantic and the pure data models; activities
are referenced by name (``durable_rollouts.workflows.types``). Ordinary failures never fail the
workflow: they come back as a ``RolloutResult`` with ``status`` and ``error_phase`` so the parent
can count them. A ``SubstrateGone`` failure (connection refused, unknown session, a host queue
nobody polls any more) tears the old substrate down and starts a new rollout attempt, up to
``max_attempts``; every attempt's error is recorded. Teardown always runs, also on cancel.

Durable agent turns: the agent activity records checkpoints with the ``checkpoint`` update (kept
in memory, so rebuilt on replay from the update events); a retried attempt fetches the latest one
with ``latest_checkpoint``, and a fresh schedule of the agent step gets it in its input. Updates
from a superseded (zombie) attempt are rejected by the validators (``CheckpointFence``).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.models import (
        AgentInput,
        AgentResult,
        ConnectInput,
        Endpoint,
        Grade,
        GradeInput,
        Opened,
        OpenSpec,
        ProvisionInput,
        RolloutResult,
        Session,
        StartInput,
        TeardownInput,
        VerifierSession,
        VerifyInput,
    )
    from durable_rollouts.workflows.checkpoints import CheckpointHandlers
    from durable_rollouts.workflows.failures import (
        STEP_FAILURES,
        failed_phase,
        failure_message,
        is_cancelled,
        is_config_error,
        is_heartbeat_timeout,
        is_substrate_gone,
        is_timeout,
    )
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
        NON_RETRYABLE,
        RolloutInput,
    )

__all__ = ["Rollout", "is_substrate_gone"]


# Upserted by every Rollout (behind the "rollout-search-attributes" patch): running, then final.
KEY_STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")
KEY_REWARD = SearchAttributeKey.for_float("RolloutsReward")
KEY_ERROR_PHASE = SearchAttributeKey.for_keyword("RolloutsErrorPhase")


def _retry(attempts: int, max_interval_s: float = 30.0) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=max_interval_s),
        maximum_attempts=attempts,
        non_retryable_error_types=NON_RETRYABLE,
    )


# name -> (start_to_close, heartbeat_timeout, retry attempts); agent's start_to_close is per input.
_OPTIONS: dict[str, tuple[timedelta, timedelta | None, int]] = {
    ACT_PROVISION: (timedelta(minutes=10), timedelta(seconds=10), 5),
    ACT_CONNECT: (timedelta(minutes=2), None, 3),
    ACT_START: (timedelta(minutes=2), None, 5),
    ACT_AGENT: (timedelta(hours=24), timedelta(seconds=5), 5),
    ACT_GRADE: (timedelta(minutes=30), timedelta(seconds=10), 5),
    ACT_VERIFY: (timedelta(minutes=30), timedelta(seconds=10), 5),
    ACT_TEARDOWN: (timedelta(minutes=2), None, 10),
    ACT_VERIFY_OPEN: (timedelta(minutes=10), timedelta(seconds=10), 5),
    ACT_VERIFY_CLOSE: (timedelta(minutes=2), None, 10),
    ACT_OPEN: (timedelta(minutes=10), timedelta(seconds=10), 5),
    ACT_CLOSE: (timedelta(minutes=30), timedelta(seconds=10), 5),
}
# Short steps that may run as local activities when the substrate is reachable from this worker;
# provision/teardown too when the substrate is fast and local (``RolloutInput.local_steps``).
_LOCAL_OK = {ACT_CONNECT, ACT_START, ACT_GRADE}
_LOCAL_IF_FAST = {ACT_PROVISION, ACT_TEARDOWN, ACT_OPEN, ACT_CLOSE}

# One patch for the merged-steps layout: it implies every earlier patch below, so a run of it
# asked one patch instead of one per patch. It also turns on the merged steps: a fast local
# substrate opens with one step (provision -> connect -> start) and, when it dies with its
# worker, closes with one (grade -> teardown). A run without its marker (started by an older
# release) asks each earlier patch on its own, exactly as that release did.
PATCH_V2 = "rollout-v2-merged-steps"
# A parent of this release names the layout in the child's input (``RolloutInput.layout`` =
# ``ROLLOUT_LAYOUT``): "merged steps", so a new run asks no patch at all. temporalio writes a
# marker event and a TemporalChangeVersion search-attribute upsert (a visibility write on the
# server) for every patch a new run asks; the input is recorded in the start event anyway.
# Runs whose input has no layout (older parents) ask ``PATCH_V2`` as before.
_IMPLIED_BY_V2 = frozenset({"rollout-search-attributes", "agent-checkpoint-schedules",
                            "agent-rerun-on-lost-worker", "verify-session-recorded"})
# How long a step may wait for a host/process queue before the substrate counts as gone.
_PINNED_SCHEDULE_TO_START = timedelta(minutes=2)


# Fresh schedules of the agent step after every attempt timed out on heartbeats (a lost worker).
_AGENT_LOST_WORKER_ROUNDS = 3


_BEFORE_LAUNCH = {"provisioning", "connecting", "starting task"}


def _actor_raw(grade: Grade, agent: AgentResult) -> dict[str, Any]:
    """What a verifier grades: the actor's grade frame, or a zero-score error frame (as steps.actor_result)."""
    if agent.error is None and not grade.is_error and grade.raw:
        return dict(grade.raw)
    return {"score": 0.0, "answer": agent.content, "content": agent.error or grade.content, "isError": True}


class _SubstrateGone(Exception):
    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


@workflow.defn(name="Rollout")
class Rollout(CheckpointHandlers):
    """One rollout of one task with one agent on one substrate."""

    def __init__(self) -> None:
        self._phase = "pending"
        self._last_phase = "provisioning"
        self._attempt = 0
        self._timeout_s: float | None = None
        self._local_steps = False
        self._queue = ""
        self._v2 = False
        self._init_checkpoints()

    def _enter(self, phase: str) -> str:
        self._phase = self._last_phase = phase
        return phase

    @workflow.query
    def phase(self) -> dict[str, Any]:
        return {"phase": self._phase, "attempt": self._attempt}

    def _patched(self, patch_id: str) -> bool:
        """``workflow.patched``, answered by ``PATCH_V2`` for the patches it implies."""
        if self._v2 and patch_id in _IMPLIED_BY_V2:
            return True
        return workflow.patched(patch_id)

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        # First, before any command: a run of an older release has no marker of it on replay. A
        # parent of this release says so in the input instead (no marker, no upsert).
        self._v2 = inp.layout >= 2 or workflow.patched(PATCH_V2)
        # New command (upserts): only where the parent says the attributes exist, behind a patch.
        publish = inp.search_attributes and self._patched("rollout-search-attributes")
        if publish and not inp.status_at_start:
            workflow.upsert_search_attributes([KEY_STATUS.value_set("running")])
        try:
            result = await self._run(inp)
        except asyncio.CancelledError:
            if publish:
                workflow.upsert_search_attributes([KEY_STATUS.value_set("cancelled")])
            raise
        if publish:
            updates = [KEY_STATUS.value_set(result.status)]
            if result.status == "succeeded" and result.reward is not None:
                updates.append(KEY_REWARD.value_set(result.reward))  # only real rewards
            if result.error_phase:
                updates.append(KEY_ERROR_PHASE.value_set(result.error_phase))
            workflow.upsert_search_attributes(updates)
        return result

    async def _run(self, inp: RolloutInput) -> RolloutResult:
        started = workflow.time()
        self._timeout_s = inp.rollout_timeout_s
        self._local_steps = inp.local_steps
        self._queue = inp.task_queue
        errors: list[str] = []
        last_phase = "provisioning"
        for attempt in range(1, inp.max_attempts + 1):
            self._attempt = attempt
            try:
                # The rollout timeout bounds each attempt (a durable timer); on expiry the running
                # step is cancelled and teardown still runs.
                result = await asyncio.wait_for(self._attempt_once(inp, attempt), inp.rollout_timeout_s)
            except asyncio.TimeoutError:
                result = self._result(inp, "timeout", error=f"rollout timed out after {inp.rollout_timeout_s}s",
                                      error_phase=self._last_phase)
            except _SubstrateGone as gone:
                errors.append(f"attempt {attempt} ({gone.phase}): {gone}")
                last_phase = gone.phase
                workflow.logger.warning("rollout %s: substrate gone in %s: %s",
                                        inp.rollout_id, gone.phase, gone)
                continue
            result.attempts = attempt
            if errors:
                prior = "; ".join(errors)
                result.error = f"{result.error}; earlier: {prior}" if result.error else f"earlier: {prior}"
            result.started_at = started
            result.ended_at = workflow.time()
            return result
        return self._result(inp, "errored", attempts=inp.max_attempts, started=started,
                            error=f"substrate gone {inp.max_attempts} times: " + "; ".join(errors),
                            error_phase=last_phase)

    # -- one attempt ---------------------------------------------------------------------------

    async def _attempt_once(self, inp: RolloutInput, attempt: int) -> RolloutResult:
        key = inp.rollout_id if attempt == 1 else f"{inp.rollout_id}-a{attempt}"
        endpoint: Endpoint | None = None
        session: Session | None = None
        merged = self._local_steps and self._v2
        ephemeral = False
        try:
            phase = self._enter("provisioning")
            provision = ProvisionInput(key=key, task=inp.task, provider=inp.provider)
            one_step = merged and inp.layout >= 4 and inp.ephemeral and inp.task.verifier is None
            if one_step:
                # Layout 4: a substrate that dies with its worker, no verifier: the agent step
                # opens, works, grades and tears down; the rollout is one activity.
                phase = self._enter("agent loop")
                agent = await self._agent(inp, None, None, {}, True,
                                          OpenSpec(key=key, provider=inp.provider))
                if agent is not None and agent.opened is not None:  # opened, but not graded
                    endpoint, session = agent.opened.endpoint, agent.opened.session
                one_close = True
            else:
                if merged:
                    opened: Opened = await self._step(ACT_OPEN, provision, Opened, None)
                    endpoint, session, prompt = opened.endpoint, opened.session, opened.prompt
                    ephemeral = opened.ephemeral
                else:
                    endpoint = await self._step(ACT_PROVISION, provision, Endpoint, None)
                    phase = self._enter("connecting")
                    session = await self._step(ACT_CONNECT, ConnectInput(endpoint=endpoint), Session,
                                               endpoint)
                    phase = self._enter("starting task")
                    prompt = await self._step(ACT_START, StartInput(endpoint=endpoint, session=session,
                                                                    task=inp.task), dict, endpoint)
                phase = self._enter("agent loop")
                # A substrate that dies with its worker closes in one step (a crash loses it
                # either way): in layout 3 the agent step itself, else (or when it could not
                # grade) ACT_CLOSE.
                one_close = ephemeral and inp.task.verifier is None
                agent = await self._agent(inp, endpoint, session, prompt, one_close and inp.layout >= 3)
            if agent is None:  # ConfigError: the agent cannot even be built; nothing to grade
                raise _Errored(phase, self._agent_config_error)
            if agent.grade is not None or endpoint is None:
                endpoint = None  # torn down by the agent step: nothing is left for the finally
                return self._graded(inp, agent, agent.grade or Grade.error("not graded"))
            phase = self._enter("grading")
            grade_input = GradeInput(endpoint=endpoint, session=session, answer=agent.content,
                                     agent_error=agent.error)
            if one_close:
                grade = await self._step(ACT_CLOSE, grade_input, Grade, endpoint)
                endpoint = None  # torn down by the same step: nothing is left for the finally
                return self._graded(inp, agent, grade)
            grade = await self._step(ACT_GRADE, grade_input, Grade, endpoint)
            if inp.task.verifier is not None:
                phase = self._enter("verifying")
                grade = await self._verify(inp, endpoint, session, _actor_raw(grade, agent), attempt)
            return self._graded(inp, agent, grade)
        except STEP_FAILURES as err:
            if is_cancelled(err):
                raise asyncio.CancelledError() from err
            phase = failed_phase(err, phase)  # which part of a merged step
            if is_substrate_gone(err):
                raise _SubstrateGone(phase, failure_message(err)) from None
            status = "failed" if phase in _BEFORE_LAUNCH else "errored"
            return self._result(inp, status, error=f"[{phase}] {failure_message(err)}", error_phase=phase)
        except _Errored as err:
            return self._result(inp, "errored", error=str(err), error_phase=err.phase)
        finally:
            if endpoint is not None:
                self._phase = "teardown"
                await self._teardown(endpoint, session)

    async def _agent(self, inp: RolloutInput, endpoint: Endpoint | None, session: Session | None,
                     prompt: dict[str, Any], close: bool,
                     open_spec: OpenSpec | None = None) -> AgentResult | None:
        # timeout_s=None: the agent's own timeout applies; the rollout timeout is a workflow timer.
        agent_input = AgentInput(endpoint=endpoint, session=session, task=inp.task, prompt=prompt,
                                 agent=inp.agent, rollout_id=inp.rollout_id, job_id=inp.job_id,
                                 group_id=inp.group_id, close=close, open=open_spec)
        self._checkpoint = None  # a new substrate (rollout attempt): older checkpoints do not apply
        lost = 0
        while True:
            # Each schedule fences off the earlier ones and starts from the latest checkpoint. Only
            # the input changes (same activity, same id): no new command, so no patch is needed.
            agent_input = agent_input.model_copy(update={
                "schedule": self._fresh_agent_schedule(), "checkpoint": self._checkpoint})
            try:
                return await self._step(ACT_AGENT, agent_input, AgentResult, endpoint)
            except STEP_FAILURES as err:
                if is_substrate_gone(err) or is_cancelled(err):
                    raise
                if open_spec is not None and failed_phase(err, "agent loop") in _BEFORE_LAUNCH:
                    raise  # it could not open: a failed start, whatever the cause
                if is_config_error(err):
                    self._agent_config_error = failure_message(err)
                    return None
                # Every attempt lost its worker (heartbeat timeouts): a hung (e.g. SIGSTOPped)
                # worker's open long polls swallow retries until they expire (~70 s), so all
                # attempts can be spent in ~40 s. Schedule the step afresh a few times.
                if (is_heartbeat_timeout(err) and lost < _AGENT_LOST_WORKER_ROUNDS
                        and self._patched("agent-rerun-on-lost-worker")):
                    lost += 1
                    workflow.logger.warning("rollout %s: agent lost its worker on every attempt; "
                                            "scheduling it again (%d)", inp.rollout_id, lost)
                    continue
                if open_spec is not None:
                    # The step itself grades what it can (the substrate is its own); a failure
                    # that ends it (it could not open, or its worker was lost) is the result.
                    raise
                # Any other agent failure is still graded, best effort.
                status = "timeout" if is_timeout(err) else "error"
                return AgentResult(status=status, error=failure_message(err))

    async def _verify(self, inp: RolloutInput, endpoint: Endpoint, session: Session,
                      actor_raw: dict[str, Any], attempt: int) -> Grade:
        assert inp.task.verifier is not None
        if self._patched("verify-session-recorded"):
            return await self._verify_recorded(inp, endpoint, session, actor_raw, attempt)
        last = ""
        for v in range(1, inp.max_attempts + 1):
            # verify_once.verify provisions the verifier under f"{key}-verifier"; a new key per try
            key = inp.rollout_id + (f"-a{attempt}" if attempt > 1 else "") + (f"-v{v}" if v > 1 else "")
            vin = VerifyInput(task=inp.task, actor_endpoint=endpoint, actor_session=session,
                              actor_raw=actor_raw, provider=inp.provider, key=key)
            try:
                return await self._step(ACT_VERIFY, vin, Grade, None)
            except STEP_FAILURES as err:
                if is_cancelled(err):
                    raise
                if not is_substrate_gone(err):
                    raise _Errored("verifying", failure_message(err)) from None
                last = failure_message(err)  # only the verifier is re-placed; the agent is not re-run
        raise _Errored("verifying", f"verifier substrate gone {inp.max_attempts} times: {last}")

    async def _verify_recorded(self, inp: RolloutInput, endpoint: Endpoint, session: Session,
                               actor_raw: dict[str, Any], attempt: int) -> Grade:
        # open (session recorded) -> grade in it (a retry gets the same verdict) -> close
        last = ""
        for v in range(1, inp.max_attempts + 1):
            key = inp.rollout_id + (f"-a{attempt}" if attempt > 1 else "") + (f"-v{v}" if v > 1 else "")
            vin = VerifyInput(task=inp.task, actor_endpoint=endpoint, actor_session=session,
                              actor_raw=actor_raw, provider=inp.provider, key=key)
            opened: VerifierSession | None = None
            try:
                opened = await self._step(ACT_VERIFY_OPEN, vin, VerifierSession, None)
                vin = vin.model_copy(update={"verifier_endpoint": opened.endpoint,
                                             "verifier_session": opened.session})
                return await self._step(ACT_VERIFY, vin, Grade, opened.endpoint)
            except STEP_FAILURES as err:
                if is_cancelled(err):
                    raise
                if not is_substrate_gone(err):
                    raise _Errored("verifying", failure_message(err)) from None
                last = failure_message(err)  # only the verifier is re-placed; the agent is not re-run
            finally:
                if opened is not None:
                    with contextlib.suppress(*STEP_FAILURES):
                        await self._step(ACT_VERIFY_CLOSE, opened, None, opened.endpoint)
        raise _Errored("verifying", f"verifier substrate gone {inp.max_attempts} times: {last}")

    async def _teardown(self, endpoint: Endpoint, session: Session | None) -> None:
        # Runs also after cancellation: a fresh activity started here is not cancelled.
        try:
            await self._step(ACT_TEARDOWN, TeardownInput(endpoint=endpoint, session=session), None,
                             endpoint)
        except STEP_FAILURES as err:
            workflow.logger.warning("teardown of %s failed: %s", endpoint.key, failure_message(err))
        except asyncio.CancelledError:
            workflow.logger.warning("teardown of %s cancelled", endpoint.key)

    # -- activity plumbing ---------------------------------------------------------------------

    async def _step(self, name: str, arg: Any, result_type: type | None, endpoint: Endpoint | None,
                    allow_local: bool = True) -> Any:
        start_to_close, heartbeat, attempts = _OPTIONS[name]
        if name == ACT_AGENT and self._timeout_s:
            start_to_close = timedelta(seconds=self._timeout_s + 60)
        own_queue = self._queue  # from the input, not workflow.info(): replays run elsewhere
        queue = endpoint.task_queue if endpoint is not None else None
        pinned = queue is not None and queue != own_queue
        local = name in _LOCAL_OK or (self._local_steps and name in _LOCAL_IF_FAST)
        if allow_local and local and not pinned:
            # The substrate is reachable from this worker: a local activity saves a round trip,
            # and a crash is still safe (the workflow task retries elsewhere; grade is idempotent).
            return await workflow.execute_local_activity(
                name, arg, result_type=result_type, start_to_close_timeout=start_to_close,
                retry_policy=_retry(attempts), summary=name.split(".")[-1],
            )
        return await workflow.execute_activity(
            name, arg, result_type=result_type, task_queue=queue if pinned else None,
            start_to_close_timeout=start_to_close, heartbeat_timeout=heartbeat,
            schedule_to_start_timeout=_PINNED_SCHEDULE_TO_START if pinned else None,
            retry_policy=_retry(attempts), summary=name.split(".")[-1],
        )

    # -- results -------------------------------------------------------------------------------

    def _graded(self, inp: RolloutInput, agent: AgentResult, grade: Grade) -> RolloutResult:
        # Same classification as the direct executor (sdk/direct.py), plus "timeout".
        if agent.status == "timeout" or agent.stop_reason == "timeout":
            status, phase, error = "timeout", "agent loop", agent.error or "agent timed out"
        elif grade.is_error:
            status, phase, error = "errored", "grading", grade.content or "grade error"
        elif agent.status == "error" or agent.error:
            status, phase, error = "errored", "agent loop", agent.error or "agent failed"
        else:
            status, phase, error = "succeeded", None, None
        result = self._result(inp, status, error=error, error_phase=phase)
        result.grade = grade
        result.reward = None if grade.is_error else grade.reward
        result.trace_ref = agent.trace_ref
        return result

    def _result(self, inp: RolloutInput, status: str, *, error: str | None = None,
                error_phase: str | None = None, attempts: int = 1,
                started: float | None = None) -> RolloutResult:
        return RolloutResult(
            rollout_id=inp.rollout_id, slug=inp.task.slug, group_id=inp.group_id,
            group_index=inp.group_index, row_index=inp.row_index, status=status,  # type: ignore[arg-type]
            attempts=attempts, error=error, error_phase=error_phase, started_at=started,
            ended_at=workflow.time() if started is not None else None,
        )

    _agent_config_error = ""


class _Errored(Exception):
    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
