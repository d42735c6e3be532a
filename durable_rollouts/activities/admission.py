"""Activities of fleet-wide admission (``workflows.admission``).

``rollouts.admit`` asks the admission workflow for a ticket by signal-with-start (the first asker
starts it); ``rollouts.admission_closed_holders`` tells it which holders closed without giving
their ticket back; :func:`report_start` is called by the provision step and tells it when this
provision attempt started, by the server's clock (``activity.info().started_time``), which is
what the rate is held on.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timezone

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from durable_rollouts.admission import SIG_ACQUIRE, SIG_STARTED, AdmissionTicket, ProvisionStarted
from durable_rollouts.workflows.admission import (
    AdmissionState,
    AdmissionWorkflow,
    AdmitInput,
    ClosedHoldersInput,
)
from durable_rollouts.workflows.types import ACT_ADMIT, ACT_CLOSED_HOLDERS

__all__ = ["AdmissionActivities", "report_start"]

REPORT_TIMEOUT_S = 5.0  # a report that cannot get through: the ticket counts until its release


class AdmissionActivities:
    """The admission activities (no dependencies besides the activity's own client)."""

    def all(self) -> list[object]:
        return [self.admit, self.closed_holders]

    @activity.defn(name=ACT_ADMIT)
    async def admit(self, inp: AdmitInput) -> None:
        """Signal-with-start: queue ``inp.request`` at the admission workflow."""
        await activity.client().start_workflow(
            AdmissionWorkflow.run, AdmissionState(limits=inp.request.limits), id=inp.workflow_id,
            task_queue=inp.task_queue, start_signal=SIG_ACQUIRE, start_signal_args=[inp.request],
            static_summary="fleet-wide admission of new substrates")

    @activity.defn(name=ACT_CLOSED_HOLDERS)
    async def closed_holders(self, inp: ClosedHoldersInput) -> list[str]:
        """The holders (Rollout workflow ids) that are no longer running."""
        client = activity.client()

        async def closed(holder: str) -> bool:
            try:
                desc = await client.get_workflow_handle(holder).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return True
                raise
            return desc.status != WorkflowExecutionStatus.RUNNING

        found = await asyncio.gather(*(closed(h) for h in inp.holders))
        return [h for h, gone in zip(inp.holders, found) if gone]


async def report_start(ticket: AdmissionTicket | None) -> None:
    """Tell the admission workflow when this provision attempt started (best effort: without
    the report the ticket counts against the rate until its release, which is stricter)."""
    if ticket is None:
        return
    started = activity.info().started_time
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    report = ProvisionStarted(ticket=ticket.ticket, at=started.timestamp())
    with contextlib.suppress(Exception):
        handle = activity.client().get_workflow_handle(ticket.workflow_id)
        await asyncio.wait_for(handle.signal(SIG_STARTED, report), REPORT_TIMEOUT_S)
