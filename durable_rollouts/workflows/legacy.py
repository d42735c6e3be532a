"""Frozen: how Rollouts recorded by earlier releases run (layouts 0-4), for replay and upgrades.

A Rollout whose input names a layout below ``types.CARD_LAYOUT`` was started by a parent of an
earlier release; its history holds the step shapes that release chose, and this module runs
exactly those, command for command, so the history replays and a run in flight finishes on this
release's workers. Never change what this code does: the golden histories under
``tests/golden/`` (one folder per release) replay through it in every test run. New Rollouts
run ``workflows.rollout`` (the card's steps) only.

The layouts, as the releases wrote them: layout 0 asks ``workflow.patched`` for each of four
patches, or for ``rollout-v2-merged-steps`` (``PATCH_V2``), which implies them; a fast local
substrate (``RolloutInput.local_steps``) then opens with one merged step, ``open`` (provision ->
connect -> start), and one that dies with its worker closes with one, ``grade_teardown``.
Layout 2 is the merged steps without the marker; layout 3 lets the agent step of such a
substrate grade and tear down itself (``AgentInput.close``); layout 4 lets the agent step also
open an in-process substrate of a task without a verifier (``AgentInput.open``).
Deterministic: imports only stdlib, temporalio, pydantic and the pure data models.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.models import (
        Endpoint,
        Grade,
        RolloutResult,
        Session,
    )
    from durable_rollouts.step_io import (
        AgentInput,
        AgentResult,
        ConnectInput,
        GradeInput,
        OpenSpec,
        Opened,
        ProvisionInput,
        StartInput,
        TeardownInput,
        VerifierSession,
        VerifyInput,
    )
    from durable_rollouts.workflows.checkpoints import AgentTurns
    from durable_rollouts.workflows.outcome import (
        BEFORE_LAUNCH,
        KEY_STATUS,
        Errored,
        SubstrateGone,
        actor_raw,
        final_attributes,
    )
    from durable_rollouts.workflows import outcome
    from durable_rollouts.workflows.plan import retry_policy
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
        RolloutInput,
    )

__all__ = ["LegacyRollout", "PATCH_V2"]


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
# Later parents named the layout in the child's input (``RolloutInput.layout`` >= 2):
# "merged steps", so such a run asks no patch at all. temporalio writes a
# marker event and a TemporalChangeVersion search-attribute upsert (a visibility write on the
# server) for every patch a new run asks; the input is recorded in the start event anyway.
# Runs whose input has no layout (older parents) ask ``PATCH_V2`` as before.
_IMPLIED_BY_V2 = frozenset({"rollout-search-attributes", "agent-checkpoint-schedules",
                            "agent-rerun-on-lost-worker", "verify-session-recorded"})
# How long a step may wait for a host/process queue before the substrate counts as gone.
_PINNED_SCHEDULE_TO_START = timedelta(minutes=2)


# Fresh schedules of the agent step after every attempt timed out on heartbeats (a lost worker).
_AGENT_LOST_WORKER_ROUNDS = 3


class LegacyRollout(AgentTurns):
    """A Rollout run of an earlier release's layout (``RolloutInput.layout`` < ``CARD_LAYOUT``)."""

    def __init__(self) -> None:
        super().__init__()
        self._last_phase = "provisioning"
        self._timeout_s: float | None = None
        self._local_steps = False
        self._queue = ""
        self._v2 = False

    def _enter(self, phase: str) -> str:
        self._phase = self._last_phase = phase
        return phase

    def _patched(self, patch_id: str) -> bool:
        """``workflow.patched``, answered by ``PATCH_V2`` for the patches it implies."""
        if self._v2 and patch_id in _IMPLIED_BY_V2:
            return True
        return workflow.patched(patch_id)

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
            workflow.upsert_search_attributes(final_attributes(result))
        return result

    async def _run(self, inp: RolloutInput) -> RolloutResult:
        self._timeout_s = inp.rollout_timeout_s
        self._local_steps = inp.local_steps
        self._queue = inp.task_queue

        def attempt(number: int) -> Awaitable[RolloutResult]:
            self._attempt = number
            return self._attempt_once(inp, number)

        return await outcome.run_attempts(inp, attempt, lambda: self._last_phase)

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
                raise Errored(phase, self._agent_config_error)
            if agent.grade is not None or endpoint is None:
                endpoint = None  # torn down by the agent step: nothing is left for the finally
                return outcome.graded(inp, agent, agent.grade or Grade.error("not graded"))
            phase = self._enter("grading")
            grade_input = GradeInput(endpoint=endpoint, session=session, answer=agent.content,
                                     agent_error=agent.error)
            if one_close:
                grade = await self._step(ACT_CLOSE, grade_input, Grade, endpoint)
                endpoint = None  # torn down by the same step: nothing is left for the finally
                return outcome.graded(inp, agent, grade)
            grade = await self._step(ACT_GRADE, grade_input, Grade, endpoint)
            if inp.task.verifier is not None:
                phase = self._enter("verifying")
                grade = await self._verify(inp, endpoint, session, actor_raw(grade, agent), attempt)
            return outcome.graded(inp, agent, grade)
        except STEP_FAILURES as err:
            if is_cancelled(err):
                raise asyncio.CancelledError() from err
            phase = failed_phase(err, phase)  # which part of a merged step
            if is_substrate_gone(err):
                raise SubstrateGone(phase, failure_message(err)) from None
            status = "failed" if phase in BEFORE_LAUNCH else "errored"
            return outcome.result(inp, status, error=f"[{phase}] {failure_message(err)}", error_phase=phase)
        except Errored as err:
            return outcome.result(inp, "errored", error=str(err), error_phase=err.phase)
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
                if open_spec is not None and failed_phase(err, "agent loop") in BEFORE_LAUNCH:
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
                    raise Errored("verifying", failure_message(err)) from None
                last = failure_message(err)  # only the verifier is re-placed; the agent is not re-run
        raise Errored("verifying", f"verifier substrate gone {inp.max_attempts} times: {last}")

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
                    raise Errored("verifying", failure_message(err)) from None
                last = failure_message(err)  # only the verifier is re-placed; the agent is not re-run
            finally:
                if opened is not None:
                    with contextlib.suppress(*STEP_FAILURES):
                        await self._step(ACT_VERIFY_CLOSE, opened, None, opened.endpoint)
        raise Errored("verifying", f"verifier substrate gone {inp.max_attempts} times: {last}")

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
                retry_policy=retry_policy(attempts), summary=name.split(".")[-1],
            )
        return await workflow.execute_activity(
            name, arg, result_type=result_type, task_queue=queue if pinned else None,
            start_to_close_timeout=start_to_close, heartbeat_timeout=heartbeat,
            schedule_to_start_timeout=_PINNED_SCHEDULE_TO_START if pinned else None,
            retry_policy=retry_policy(attempts), summary=name.split(".")[-1],
        )

    _agent_config_error = ""
