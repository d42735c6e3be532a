"""A job at a glance without reading every rollout: for ``rollouts show`` on a long job.

``jobs.load_job`` builds one Run per rollout (every result chunk read, every running child
described): right for a job of hundreds, minutes for a training job of 100,000. This reads
per batch only its description, its input, its counters (the result's ``progress`` once it
completed, else the ``progress`` query, else the counters carried into the current run) and the
latest finished results (the inline ones and the newest claim-checked chunk). Its cost does not
grow with the job's length.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from ..errors import ConfigError
from ..models import RolloutResult
from ..workflows import Progress, TasksetRun, TasksetRunInput, TasksetRunResult
from .jobs import batch_descriptions, job_status, read_input, status_name, workflow_ids
from .parts import batch_progress

__all__ = ["BatchSummary", "JobSummary", "summarize_job"]

QUERY_TIMEOUT_S = 3.0


@dataclass
class BatchSummary:
    """One batch's counters and its latest finished results."""

    index: int
    workflow_id: str
    status: str
    input: TasksetRunInput
    progress: Progress
    progress_source: str  # "result", "query" or "carried" (as of the last continue-as-new)
    latest: list[RolloutResult] = field(default_factory=list)
    started_at: datetime | None = None
    closed_at: datetime | None = None

    @property
    def rows(self) -> int:
        inp = self.input
        return inp.total_rows if inp.total_rows is not None else len(inp.rows)

    @property
    def rollouts(self) -> int:
        """Rollouts this batch will run (or has started, when open-ended)."""
        inp = self.input
        if inp.open_ended:
            return max(self.progress.total, self.progress.started)
        return self.rows * inp.group


@dataclass
class JobSummary:
    job_id: str
    batches: list[BatchSummary]

    @property
    def rollouts(self) -> int:
        return sum(b.rollouts for b in self.batches)

    @property
    def status(self) -> str:
        return job_status(b.status for b in self.batches)


def _latest(inline: list[RolloutResult], refs: list[Any], keep: int) -> list[RolloutResult]:
    """The newest ``keep`` finished results: the inline ones, topped up from the newest chunk."""
    from ..stores.results import ResultStore

    out = list(inline)
    if len(out) < keep and refs:
        with contextlib.suppress(OSError, ValueError):
            out = list(ResultStore.get(refs[-1])) + out
    return out[-keep:]


async def _summary(client: Client, index: int, desc: Any, keep: int) -> BatchSummary:
    inp: TasksetRunInput = await read_input(client, desc.id, desc.run_id, TasksetRunInput)
    status = status_name(desc.status)
    progress, source = inp.progress or Progress(job_id=inp.job_id, batch_index=index), "carried"
    latest_inline, refs = list(inp.results), list(inp.result_refs)
    handle = client.get_workflow_handle_for(TasksetRun.run, desc.id, run_id=desc.run_id)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        res = await handle.result()
        assert isinstance(res, TasksetRunResult)
        progress, source = res.progress, "result"
        latest_inline, refs = list(res.results), list(res.result_refs)
    elif desc.status == WorkflowExecutionStatus.RUNNING:
        with contextlib.suppress(Exception):  # no worker answering: the carried counters
            progress = await asyncio.wait_for(  # a batch run as parts: their counters added
                batch_progress(handle, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)),
                QUERY_TIMEOUT_S + 1)
            source = "query"
    latest = await asyncio.to_thread(_latest, latest_inline, refs, keep)
    return BatchSummary(index=index, workflow_id=desc.id, status=status, input=inp,
                        progress=progress, progress_source=source, latest=latest,
                        started_at=desc.start_time, closed_at=desc.close_time)


async def summarize_job(client: Client, job_id: str, *, latest: int = 20) -> JobSummary:
    """Every batch of ``job_id`` by its counters and its ``latest`` finished results.

    Raises:
        ConfigError: no job with that id.
    """
    for candidate in workflow_ids(job_id):
        descs = await batch_descriptions(client, candidate)
        if descs:
            batches = [await _summary(client, i, d, latest) for i, d in enumerate(descs)]
            return JobSummary(job_id=candidate, batches=batches)
    raise ConfigError(f"no job with id {job_id!r} (list recent jobs with `rollouts jobs`)")
