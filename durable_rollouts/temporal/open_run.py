"""Queries that ask a batch's open run, never a run closed by continue-as-new.

A query that reaches a run as it continues as new is answered by a worker replaying that closed
run's whole history: 5-6 s of CPU at 5,700 events (measured in ``bench_stream.py --long``), and
on glibc the multi-MiB buffers of that replay stay in the worker's malloc arenas. Asked with
``QueryRejectCondition.NOT_OPEN``, the server refuses instead, and the next run is asked. A batch
that has closed for good is asked as it stands (its result is what there is to read).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition

__all__ = ["HandedOver", "query_latest", "query_open"]

HANDOVER_TRIES = 10
HANDOVER_WAIT_S = 0.2


class HandedOver(Exception):
    """The run a query reached closed as it came (it continued as new): ask the next run."""


async def query_open(handle: WorkflowHandle[Any, Any], query: Any, arg: Any = None, *,
                     rpc_timeout: timedelta | None = None) -> Any:
    """``handle.query(query, arg)`` answered by an open run.

    Raises:
        HandedOver: the run closed as the query came and the workflow runs on in a new run.
    """
    args = [] if arg is None else [arg]
    try:
        return await handle.query(query, args=args, reject_condition=QueryRejectCondition.NOT_OPEN,
                                  rpc_timeout=rpc_timeout)
    except WorkflowQueryRejectedError:
        latest = handle._client.get_workflow_handle(handle.id)  # a handle keeps its client private
        if (await latest.describe(rpc_timeout=rpc_timeout)).status == WorkflowExecutionStatus.RUNNING:
            raise HandedOver from None
        return await handle.query(query, args=args, rpc_timeout=rpc_timeout)


async def query_latest(handle: WorkflowHandle[Any, Any], query: Any, arg: Any = None, *,
                       rpc_timeout: timedelta | None = None) -> Any:
    """:func:`query_open`, asked again (``HANDOVER_WAIT_S`` apart) while runs hand over; the
    handle must not name a run (it would keep reaching the closed one)."""
    for _ in range(HANDOVER_TRIES - 1):
        try:
            return await query_open(handle, query, arg, rpc_timeout=rpc_timeout)
        except HandedOver:
            await asyncio.sleep(HANDOVER_WAIT_S)
    return await query_open(handle, query, arg, rpc_timeout=rpc_timeout)
