"""List, cancel and wait for jobs: ``rollouts jobs`` (Temporal visibility), ``rollouts cancel``,
and ``wait_closed`` (the background worker of ``run --detach`` exits once its job has closed).

Imports temporalio and ``temporal.jobs``; never the CLI.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from ..errors import ConfigError
from ..ids import batch_of
from .jobs import batch_descriptions, describe, status_name, workflow_ids

__all__ = ["CancelOutcome", "JobSummary", "cancel_job", "list_jobs", "running_children", "wait_closed"]


@dataclass
class JobSummary:
    """A row of ``rollouts jobs``: a job from Temporal visibility (its batches folded together)."""

    job_id: str
    name: str = ""
    taskset: str = ""
    agent: str = ""
    status: str = ""
    batches: int = 0
    started_at: datetime | None = None
    closed_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "taskset": self.taskset,
            "agent": self.agent,
            "status": self.status,
            "batches": self.batches,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
        }


_BATCH_SUFFIX = re.compile(r"-b\d+$")
_STATUS_QUERY = {
    "running": "Running",
    "completed": "Completed",
    "cancelled": "Canceled",
    "failed": "Failed",
    "terminated": "Terminated",
    "timed_out": "TimedOut",
}


def _attr(wf: Any, name: str) -> str:
    value = wf.search_attributes.get(name) if wf.search_attributes else None
    return str(value[0]) if value else ""


async def list_jobs(
    client: Client, *, status: str | None = None, limit: int = 20
) -> list[JobSummary]:
    """The most recent jobs, newest first (each job once, however many batches and resumes)."""
    query = "WorkflowType = 'TasksetRun'"
    if status is not None:
        if status not in _STATUS_QUERY:
            raise ConfigError(f"--status {status!r}: use one of {', '.join(_STATUS_QUERY)}")
        query += f" AND ExecutionStatus = '{_STATUS_QUERY[status]}'"
    jobs: dict[str, JobSummary] = {}
    latest: dict[str, tuple[str, datetime, str]] = {}  # workflow id -> (job id, start, state)
    async for wf in client.list_workflows(query, limit=max(limit * 20, 200)):
        if wf.status == WorkflowExecutionStatus.CONTINUED_AS_NEW or batch_of(wf.id) != wf.id:
            continue  # the chain's latest run is listed on its own; a part, with its batch
        job_id = _attr(wf, "RolloutsJobId") or _BATCH_SUFFIX.sub("", wf.id.removeprefix("job-"))
        if job_id not in jobs:
            if len(jobs) >= limit:
                continue
            jobs[job_id] = JobSummary(
                job_id=job_id,
                name=_attr(wf, "RolloutsJobName"),
                taskset=_attr(wf, "RolloutsTaskset"),
                agent=_attr(wf, "RolloutsAgent"),
            )
        job = jobs[job_id]
        job.started_at = min(filter(None, [job.started_at, wf.start_time]))
        if wf.close_time is not None:
            job.closed_at = max(filter(None, [job.closed_at, wf.close_time]))
        seen = latest.get(wf.id)
        if seen is None or seen[1] < wf.start_time:  # an older run of a resumed batch loses
            latest[wf.id] = (job_id, wf.start_time, status_name(wf.status))
    for job_id, job in jobs.items():
        runs = sorted((start, state) for jid, start, state in latest.values() if jid == job_id)
        job.batches = len(runs)
        states = {state for _, state in runs}
        job.status = "running" if "running" in states else runs[-1][1]
        if job.status == "running":
            job.closed_at = None
    return sorted(jobs.values(), key=lambda j: j.started_at or datetime.min, reverse=True)


@dataclass
class CancelOutcome:
    job_id: str
    cancelled: list[str]  # batch workflow ids that were running
    still_running: int  # Rollout children still tearing down when the wait ended


async def running_children(client: Client, job_id: str) -> int:
    query = (
        f"RolloutsJobId = '{job_id}' AND WorkflowType = 'Rollout' AND ExecutionStatus = 'Running'"
    )
    try:
        return (await client.count_workflows(query)).count
    except RPCError:
        return 0  # no search attributes on this server: nothing to wait on


async def cancel_job(client: Client, job_id: str, *, wait_s: float = 60.0) -> CancelOutcome:
    """Request cancellation of every running batch of ``job_id`` and wait until their Rollout
    children closed (each runs its teardown on cancel), at most ``wait_s`` seconds.

    Raises:
        ConfigError: no job with that id.
    """
    running: list[str] = []
    found = None
    for candidate in workflow_ids(job_id):
        descs = await batch_descriptions(client, candidate)
        running = [d.id for d in descs if d.status == WorkflowExecutionStatus.RUNNING]
        if descs:
            found = candidate
            break
    if found is None:
        raise ConfigError(f"no job with id {job_id!r} (list recent jobs with `rollouts jobs`)")
    for wf_id in running:
        await client.get_workflow_handle(wf_id).cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pending = list(running)
    while pending and loop.time() < deadline:
        desc = await describe(client, pending[0])
        if desc is None or desc.status != WorkflowExecutionStatus.RUNNING:
            pending.pop(0)
        else:
            await asyncio.sleep(0.2)
    left = await running_children(client, found) if running else 0
    while left and loop.time() < deadline:
        await asyncio.sleep(0.3)
        left = await running_children(client, found)
    return CancelOutcome(job_id=found, cancelled=running, still_running=left)


async def wait_closed(
    client: Any, job_id: str, poll_s: float = 1.0, give_up_s: float = 60.0
) -> None:
    """Return once every batch of ``job_id`` and its Rollout children have closed.

    Used by ``rollouts worker --until-job``. Also returns when the job never shows up, or when
    Temporal stays unreachable, for ``give_up_s``.
    """
    loop = asyncio.get_running_loop()
    last_seen = loop.time()
    while True:
        try:
            states = [desc.status for desc in await batch_descriptions(client, job_id)]
            if (
                states
                and WorkflowExecutionStatus.RUNNING not in states
                and not await running_children(client, job_id)
            ):
                return
        except RPCError:
            states = []
        if states:
            last_seen = loop.time()
        elif loop.time() - last_seen > give_up_s:
            return
        await asyncio.sleep(poll_s)
