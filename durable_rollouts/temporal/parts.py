"""The progress of a batch, also of one run as parts (``workflows.fan_out``).

A batch run as parts counts its finished parts itself and lists the running ones in
``Progress.parts``; their own ``progress`` queries add the rest, so every reader sees one batch.
Imports temporalio and the workflow names and models.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from ..workflows import TasksetRun
from ..workflows.fan_out import add_progress
from ..workflows.types import Progress
from .open_run import query_latest

__all__ = ["batch_progress"]


async def batch_progress(handle: Any, rpc_timeout: timedelta | None = None) -> Progress:
    """The ``progress`` query of the batch behind ``handle`` (asked of open runs: ``open_run``),
    its running parts' counters added (a part that does not answer counts as not started)."""
    progress: Progress = await query_latest(handle, TasksetRun.progress, rpc_timeout=rpc_timeout)
    if not progress.parts:
        return progress
    client = handle._client  # a WorkflowHandle keeps its client private
    answers = await asyncio.gather(
        *(query_latest(client.get_workflow_handle(wid), TasksetRun.progress, rpc_timeout=rpc_timeout)
          for wid in progress.parts),
        return_exceptions=True)
    for part in answers:
        if isinstance(part, Progress):
            add_progress(progress, part)
    return progress
