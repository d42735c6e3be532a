"""The ``RolloutsAdmission`` workflow (a fleet-wide semaphore with a rate) and the Rollout's side.

One admission workflow per task queue and runtime kind (``admission.admission_workflow_id``)
holds two counts: tickets held (a Rollout attempt holds one from its grant until after its
teardown: at most ``max_substrates``) and tickets counting against the rate (from the grant until
``window_s`` after the provision started, as the provision step reports with the server's start
time: at most ``burst``). Requests wait in order. The Rollout asks through the ``rollouts.admit``
activity (signal-with-start, so the first asker starts the workflow), waits for the ``admitted``
signal, and gives the ticket back with a ``release`` signal. Holders that closed without giving
back (a terminated Rollout) are found by an activity while requests wait on the ceiling. The
workflow keeps its history short with continue-as-new and ends after a quiet ``IDLE``.

Deterministic: temporalio and the pure models only; activities are referenced by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.admission import (
        ADMISSION_WORKFLOW,
        SIG_ACQUIRE,
        SIG_ADMITTED,
        SIG_RELEASE,
        SIG_STARTED,
        Admission,
        AdmissionTicket,
        AdmitRequest,
        ProvisionStarted,
        admission_workflow_id,
    )
    from durable_rollouts.models import StrictModel
    from durable_rollouts.workflows.plan import retry_policy
    from durable_rollouts.workflows.types import ACT_ADMIT, ACT_CLOSED_HOLDERS, RolloutInput

__all__ = ["AdmissionState", "AdmissionWorkflow", "AdmitInput", "ClosedHoldersInput", "admitted"]

IDLE = timedelta(minutes=10)  # nothing held, waiting or counting this long: the workflow ends
MAX_HISTORY = 4_000  # continue-as-new past this many events (or when the server suggests it)
EPSILON_S = 0.01  # margin on a reported start time


class AdmissionState(StrictModel):
    """The admission workflow's state: its input, and what continue-as-new carries."""

    limits: Admission = Field(default_factory=Admission)
    holders: dict[str, str] = Field(default_factory=dict)  # ticket -> holder (Rollout workflow id)
    waiting: list[AdmitRequest] = Field(default_factory=list)  # in arrival order
    counting: dict[str, float | None] = Field(default_factory=dict)  # ticket -> rate slot ends (None: not started)
    granted: int = 0  # tickets granted so far (all runs)


class AdmitInput(StrictModel):
    """``rollouts.admit``: signal-with-start the admission workflow with ``request``."""

    workflow_id: str
    task_queue: str
    request: AdmitRequest


class ClosedHoldersInput(StrictModel):
    holders: list[str]


@workflow.defn(name=ADMISSION_WORKFLOW)
class AdmissionWorkflow:
    """Grants tickets in arrival order while both the ceiling and the rate allow."""

    @workflow.init
    def __init__(self, state: AdmissionState) -> None:
        self._s = state.model_copy(deep=True)
        self._changed = False

    @workflow.run
    async def run(self, state: AdmissionState) -> int:
        quiet_since = workflow.time()
        last_sweep = workflow.time()
        while True:
            now = workflow.time()
            granted = self._grantable(now)
            if granted:  # one workflow task sends them all
                await asyncio.gather(*(self._tell(req) for req in granted))
            if self._s.holders or self._s.waiting or self._s.counting:
                quiet_since = now
            elif now - quiet_since >= IDLE.total_seconds():
                await workflow.wait_condition(workflow.all_handlers_finished)
                return self._s.granted
            if self._blocked_on_ceiling() and now - last_sweep >= self._s.limits.sweep_s:
                last_sweep = now
                await self._sweep()
                continue
            info = workflow.info()
            if info.is_continue_as_new_suggested() or info.get_current_history_length() > MAX_HISTORY:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._s)
            self._changed = False
            try:
                await workflow.wait_condition(lambda: self._changed, timeout=self._wake(now))
            except TimeoutError:
                pass

    # -- signals --------------------------------------------------------------------------

    @workflow.signal(name=SIG_ACQUIRE)
    def acquire(self, req: AdmitRequest) -> None:
        self._s.limits = req.limits
        if req.ticket not in self._s.holders and all(w.ticket != req.ticket for w in self._s.waiting):
            self._s.waiting.append(req)  # a retried admit activity asks again: once is enough
        self._changed = True

    @workflow.signal(name=SIG_STARTED)
    def provision_started(self, started: ProvisionStarted) -> None:
        # a retried provision of a ticket whose slot ended counts again from its own start
        self._s.counting[started.ticket] = started.at + self._s.limits.window_s + EPSILON_S
        self._changed = True

    @workflow.signal(name=SIG_RELEASE)
    def release(self, ticket: str) -> None:
        self._s.holders.pop(ticket, None)
        self._s.waiting = [w for w in self._s.waiting if w.ticket != ticket]
        if ticket in self._s.counting and self._s.counting[ticket] is None:
            # granted, start never reported: it may have started, so count it a window from now
            self._s.counting[ticket] = workflow.time() + self._s.limits.window_s + EPSILON_S
        self._changed = True

    @workflow.query
    def state(self) -> AdmissionState:
        return self._s

    # -- granting -------------------------------------------------------------------------

    def _counting(self, now: float) -> int:
        self._s.counting = {t: end for t, end in self._s.counting.items() if end is None or end > now}
        return len(self._s.counting)

    def _grantable(self, now: float) -> list[AdmitRequest]:
        limits, out = self._s.limits, []
        while self._s.waiting:
            if limits.max_substrates is not None and len(self._s.holders) >= limits.max_substrates:
                break
            if limits.max_provisions_per_s is not None and self._counting(now) >= limits.burst:
                break
            req = self._s.waiting.pop(0)
            self._s.holders[req.ticket] = req.holder
            if limits.max_provisions_per_s is not None:
                self._s.counting[req.ticket] = None
            self._s.granted += 1
            out.append(req)
        return out

    async def _tell(self, req: AdmitRequest) -> None:
        try:
            await workflow.get_external_workflow_handle(req.holder).signal(SIG_ADMITTED, req.ticket)
        except FailureError as err:  # the holder closed meanwhile: its ticket is free again
            workflow.logger.info("admission: %s is gone (%s); ticket freed", req.holder, err)
            self._s.holders.pop(req.ticket, None)
            self._s.counting.pop(req.ticket, None)

    def _wake(self, now: float) -> timedelta | None:
        """When the next rate slot ends (None: nothing to wait for but a signal)."""
        ends = [end for end in self._s.counting.values() if end is not None]
        waits = []
        if ends and self._s.waiting:
            waits.append(max(0.001, min(ends) - now))
        if self._blocked_on_ceiling():
            waits.append(self._s.limits.sweep_s)
        if not (self._s.holders or self._s.waiting or self._s.counting):
            waits.append(IDLE.total_seconds())
        return timedelta(seconds=min(waits)) if waits else None

    def _blocked_on_ceiling(self) -> bool:
        ceiling = self._s.limits.max_substrates
        return bool(self._s.waiting) and ceiling is not None and len(self._s.holders) >= ceiling

    async def _sweep(self) -> None:
        """Free the tickets of holders that closed without giving them back (e.g. terminated)."""
        holders = sorted(set(self._s.holders.values()))
        try:
            closed: list[str] = await workflow.execute_activity(
                ACT_CLOSED_HOLDERS, ClosedHoldersInput(holders=holders), result_type=list[str],
                start_to_close_timeout=timedelta(minutes=1), retry_policy=retry_policy(3))
        except ActivityError as err:
            workflow.logger.warning("admission: holder sweep failed: %s", err)
            return
        gone = set(closed)
        for ticket, holder in list(self._s.holders.items()):
            if holder in gone:
                workflow.logger.warning("admission: %s closed holding %s; ticket freed", holder, ticket)
                self.release(ticket)


# -- the Rollout's side -------------------------------------------------------------------


@asynccontextmanager
async def admitted(inp: RolloutInput, number: int, granted: set[str],
                   waiting: Callable[[bool], None]) -> AsyncIterator[AdmissionTicket]:
    """Hold an admission ticket for rollout attempt ``number``: ask, wait for the grant
    (``waiting(True)`` meanwhile), yield the ticket, and give it back on every path."""
    assert inp.admission is not None
    me = workflow.info().workflow_id
    ticket = AdmissionTicket(workflow_id=admission_workflow_id(inp.task_queue, inp.provider.kind),
                             ticket=f"{me}#{number}", task_queue=inp.task_queue)
    request = AdmitRequest(ticket=ticket.ticket, holder=me, limits=inp.admission)
    waiting(True)
    try:
        await workflow.execute_activity(
            ACT_ADMIT, AdmitInput(workflow_id=ticket.workflow_id, task_queue=inp.task_queue,
                                  request=request),
            summary="admission", start_to_close_timeout=timedelta(seconds=30),
            retry_policy=retry_policy(20))
        await workflow.wait_condition(lambda: ticket.ticket in granted)
        waiting(False)
        yield ticket
    finally:
        granted.discard(ticket.ticket)
        try:
            await workflow.get_external_workflow_handle(ticket.workflow_id).signal(SIG_RELEASE, ticket.ticket)
        except FailureError as err:  # the admission workflow is gone: nothing is held there
            workflow.logger.warning("admission: release of %s failed: %s", ticket.ticket, err)
