"""Read jobs through Temporal: connect, find a job's batches, collect one result per rollout.

The one reader of jobs: ``Taskset.run``/``get_job`` (``temporal.batches``) and every CLI view use it.

A job is one or more ``TasksetRun`` batches (workflow ids ``job-<id>``, ``job-<id>-b<n>``). A
batch's results are read from its workflow result when it completed, else from its ``Rollout``
children (one workflow per stable rollout id, so the latest run of that id is the latest result
of that rollout): this also works for cancelled, terminated and running batches. Every view has
each rollout exactly once, in expansion order (row, group index). Imports temporalio, the
workflow names/models and the sdk's Job/Run/TraceStore; never the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from ..errors import ConfigError
from ..models import RolloutResult, Task
from ..sdk.job import Job, mark_dropped
from ..sdk.run import Run
from ..stores.tracestore import TraceStore
from ..workflows import TasksetRun, child_id, group_id, rollout_id, workflow_id
from ..workflows.types import ResultsRef, RolloutInput, TasksetRunInput, TasksetRunResult

KEY_STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")

__all__ = [
    "BatchView",
    "JobView",
    "batch_descriptions",
    "batch_rows",
    "child_task",
    "connect",
    "dedupe_latest",
    "describe",
    "job_status",
    "load_job",
    "load_results",
    "read_input",
    "run_from_result",
    "status_name",
    "workflow_closed",
    "workflow_ids",
]

NOT_FOUND = "workflow not found"

_ADDRESS = re.compile(r"^[\w.\-\[\]:]+:\d{1,5}$")
_CHILD_LOOKUPS = 32  # concurrent describe/result calls when reading children


def status_name(status: WorkflowExecutionStatus | None) -> str:
    """``running``, ``completed``, ``canceled`` -> ``cancelled``, ``timed_out`` ..."""
    if status is None:
        return "unknown"
    name = status.name.lower()
    return "cancelled" if name == "canceled" else name


async def connect(address: str | None, timeout: float = 5.0) -> Client:
    """A client for ``address`` (else ``$ROLLOUTS_TEMPORAL_ADDRESS``, else the embedded server).

    Raises:
        ConfigError: a malformed address, or no Temporal answering there within ``timeout``.
    """
    from durable_rollouts.temporal.connection import connect_client, resolve_address

    resolved = resolve_address(address)
    if resolved is not None and not _ADDRESS.match(resolved):
        raise ConfigError(f"--temporal {resolved!r} is not HOST:PORT")
    try:
        # The embedded server may need to start first: give it longer.
        return await asyncio.wait_for(
            connect_client(resolved), timeout if resolved else max(timeout, 60.0)
        )
    except TimeoutError:
        where = resolved or "the embedded dev server"
        raise ConfigError(
            f"cannot reach Temporal at {where}: no answer within {timeout:g}s"
        ) from None
    except ConfigError as exc:
        message = str(exc).splitlines()[0]
        if resolved is not None and "ConnectionRefused" in message:
            message = f"cannot reach Temporal at {resolved}: connection refused"
        raise ConfigError(message) from None


def dedupe_latest(results: list[RolloutResult]) -> dict[str, RolloutResult]:
    """One result per rollout id; a later entry wins (results are listed oldest first)."""
    out: dict[str, RolloutResult] = {}
    for result in results:
        out.pop(result.rollout_id, None)
        out[result.rollout_id] = result
    return out


def load_results(refs: list[ResultsRef], inline: list[RolloutResult]) -> list[RolloutResult]:
    """Claim-checked chunks first, then the inline results: chronological order."""
    from ..stores.results import ResultStore

    out: list[RolloutResult] = []
    for ref in refs:
        out.extend(ResultStore.get(ref))
    return out + list(inline)


async def read_input(client: Client, wf_id: str, run_id: str | None, model: type[Any]) -> Any:
    """The input a workflow run was started with (first history event), decoded as ``model``."""
    handle = client.get_workflow_handle(wf_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        (value,) = await client.data_converter.decode(payloads, [model])
        return value
    raise ConfigError(f"workflow {wf_id} has no history")


def job_status(batch_states: Iterable[str]) -> str:
    """A job's status from its batches': the first of running, cancelled, terminated, failed,
    timed_out that any batch has, else completed."""
    states = set(batch_states)
    return next((s for s in ("running", "cancelled", "terminated", "failed", "timed_out")
                 if s in states), "completed")


@dataclass
class BatchView:
    """One TasksetRun batch as it stands now."""

    index: int
    workflow_id: str
    run_id: str
    status: str
    input: TasksetRunInput
    rows: list[Task]
    runs: list[Run]
    started_at: datetime | None = None
    closed_at: datetime | None = None
    memo: dict[str, Any] = field(default_factory=dict)
    search_attributes: Any = None

    @property
    def results(self) -> list[RolloutResult]:
        """Compact results of the runs that have one (not running or pending)."""
        return [r.to_result() for r in self.runs if r.status not in ("running", "waiting", "pending")]


@dataclass
class JobView:
    """A job: its batches, newest state of every rollout, and the sdk Job built from them."""

    job_id: str
    batches: list[BatchView]

    @property
    def runs(self) -> list[Run]:
        return [run for batch in self.batches for run in batch.runs]

    @property
    def name(self) -> str:
        first = self.batches[0]
        return str(first.memo.get("job_name") or first.input.job_name or self.job_id)

    @property
    def status(self) -> str:
        return job_status(b.status for b in self.batches)

    def job(self) -> Job:
        first = self.batches[0].input
        job = Job(id=self.job_id, name=self.name, group=first.group, taskset=first.taskset_name)
        job.runs = self.runs
        job.batches = len(self.batches)
        job.agent = first.agent
        return job


# ---------------------------------------------------------------------------------------------
# Collecting a job


def workflow_ids(job_id: str) -> list[str]:
    ids = [job_id]
    if job_id.startswith("job-"):
        ids.append(job_id[4:])  # `rollouts show job-<id>` (the workflow id) works too
    return ids


async def describe(client: Client, wf_id: str) -> Any | None:
    try:
        return await client.get_workflow_handle(wf_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def workflow_closed(client: Client, workflow_id: str) -> str | None:
    """Why workflow ``workflow_id`` is over (``workflow completed``, ``workflow not found``, ...),
    or None while it runs (gc asks this of every labelled substrate)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe(
            rpc_timeout=timedelta(seconds=10)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return NOT_FOUND
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    status = desc.status.name.lower() if desc.status is not None else "closed"
    return f"workflow {status}"


async def _child_result(
    client: Client, rid: str, sem: asyncio.Semaphore, retries: int = 0
) -> RolloutResult | str | None:
    """The latest result of rollout ``rid``: a RolloutResult, ``"running"``, or None (never started).

    With ``retries``, its children ``<rid>-r<n>`` (fresh re-runs) count too: the one started last wins.
    """
    async with sem:
        descs = [d for d in [await describe(client, child_id(rid, n)) for n in range(retries + 1)] if d]
        if not descs:
            return None
        desc = max(descs, key=lambda d: d.start_time.timestamp() if d.start_time else 0.0)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            # a rollout waiting for fleet-wide admission says so in RolloutsStatus
            return "waiting" if desc.typed_search_attributes.get(KEY_STATUS) == "waiting" else "running"
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            result = await client.get_workflow_handle(
                desc.id, run_id=desc.run_id, result_type=RolloutResult
            ).result()
            assert isinstance(result, RolloutResult)
            return result.model_copy(update={"rollout_id": rid})
        return status_name(desc.status)


def batch_rows(inp: TasksetRunInput) -> list[Task]:
    """A batch's rows: inline, or from the claim-checked rows file of a large taskset."""
    if inp.rows_ref is None:
        return list(inp.rows)
    from ..stores.results import ResultStore

    return ResultStore.get_rows(
        inp.rows_ref, 0, inp.total_rows if inp.total_rows is not None else 1 << 62
    )


async def reached_rows(client: Client, job_id: str, desc: Any, inp: TasksetRunInput) -> list[Task]:
    """The rows an open-ended batch (``epochs=None``) has reached, not the epochs it never will:
    a completed one's up to its last result; else those up to the carried ``next_index``, then
    each further row whose group's first rollout started (groups start in order)."""
    from ..stores.results import ResultStore

    assert inp.rows_ref is not None

    def get(start: int, stop: int) -> Any:
        return asyncio.to_thread(ResultStore.get_rows, inp.rows_ref, start, stop)

    if desc.status == WorkflowExecutionStatus.COMPLETED:
        res = await client.get_workflow_handle_for(TasksetRun.run, desc.id, run_id=desc.run_id).result()
        return list(await get(0, 1 + max((r.row_index for r in load_results(res.result_refs, res.results)),
                                         default=-1)))
    rows: list[Task] = list(await get(0, -(-inp.next_index // inp.group)))
    sem = asyncio.Semaphore(_CHILD_LOOKUPS)

    async def started(task: Task) -> bool:
        async with sem:
            return await describe(client, rollout_id(job_id, task.slug, 0, inp.batch_index)) is not None

    while True:
        window = await get(len(rows), len(rows) + 100)
        found = await asyncio.gather(*(started(t) for t in window))
        reached = next((i for i, ok in enumerate(found) if not ok), len(window))
        rows.extend(window[:reached])
        if reached < len(window) or not window:
            return rows


def _slots(rows: list[Task], group: int) -> list[tuple[int, int]]:
    return [(row, gi) for row in range(len(rows)) for gi in range(group)]


def _placeholder(
    job_id: str, inp: TasksetRunInput, task: Task, row: int, gi: int, status: str, error: str | None
) -> Run:
    return Run(
        task=task,
        job_id=job_id,
        rollout_id=rollout_id(job_id, task.slug, gi, inp.batch_index),
        group_id=group_id(job_id, row, inp.batch_index),
        slug=task.slug,
        group_index=gi,
        row_index=row,
        status=status,
        error=error,
        attempts=0,
    )


async def _latest_by_rollout(client: Client, job_id: str, desc: Any, inp: TasksetRunInput,
                             rows: list[Task]) -> dict[str, RolloutResult | str | None]:
    """Rollout id -> its latest result, ``"running"``, a closed child's status, or None: from the
    batch result when the batch completed, else from its Rollout children."""
    by_id: dict[str, RolloutResult | str | None]
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        res = await client.get_workflow_handle_for(
            TasksetRun.run, desc.id, run_id=desc.run_id
        ).result()
        assert isinstance(res, TasksetRunResult)
        by_id = dict(dedupe_latest(load_results(res.result_refs, res.results)))
    else:
        carried = dedupe_latest(load_results(inp.result_refs, inp.results))
        sem = asyncio.Semaphore(_CHILD_LOOKUPS)
        ids = [
            rollout_id(job_id, rows[row].slug, gi, inp.batch_index)
            for row, gi in _slots(rows, inp.group)
        ]
        found = await asyncio.gather(
            *(_child_result(client, rid, sem, inp.retries) for rid in ids)
        )
        by_id = {
            rid: (value if value is not None else carried.get(rid))
            for rid, value in zip(ids, found)
        }
    return by_id


def _runs(job_id: str, inp: TasksetRunInput, rows: list[Task], closed: bool,
          by_id: dict[str, RolloutResult | str | None], store: TraceStore | None) -> list[Run]:
    """One Run per slot (row, group index) in expansion order; placeholders for rollouts
    without a result; then any result that matches no slot."""
    runs: list[Run] = []
    for row, gi in _slots(rows, inp.group):
        task = rows[row]
        rid = rollout_id(job_id, task.slug, gi, inp.batch_index)
        value = by_id.pop(rid, None)
        if isinstance(value, RolloutResult):
            runs.append(run_from_result(value, task, job_id, store))
        elif value in ("running", "waiting"):
            runs.append(
                _placeholder(
                    job_id, inp, task, row, gi, "cancelling" if closed else str(value), None
                )
            )
        elif value is None:
            state = "pending" if not closed else "cancelled"
            runs.append(
                _placeholder(
                    job_id, inp, task, row, gi, state, None if not closed else "never started"
                )
            )
        else:  # a child that closed without a result (cancelled, terminated ...)
            runs.append(
                _placeholder(
                    job_id,
                    inp,
                    task,
                    row,
                    gi,
                    "cancelled" if value in ("cancelled", "terminated") else "errored",
                    f"rollout workflow {value}",
                )
            )
    for value in by_id.values():  # results whose id matches no slot (should not happen): keep them
        if isinstance(value, RolloutResult):
            runs.append(run_from_result(value, None, job_id, store))
    mark_dropped(runs, inp.on_error)
    return runs


async def _batch(client: Client, job_id: str, index: int, desc: Any, traces: bool) -> BatchView:
    inp: TasksetRunInput = await read_input(client, desc.id, desc.run_id, TasksetRunInput)
    rows = await reached_rows(client, job_id, desc, inp) if inp.open_ended else batch_rows(inp)
    status = status_name(desc.status)
    by_id = await _latest_by_rollout(client, job_id, desc, inp, rows)
    runs = _runs(job_id, inp, rows, status != "running", by_id, TraceStore() if traces else None)
    memo: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        memo = await desc.memo()
    return BatchView(
        index=index,
        workflow_id=desc.id,
        run_id=desc.run_id,
        status=status,
        input=inp,
        rows=rows,
        runs=runs,
        started_at=desc.start_time,
        closed_at=desc.close_time,
        memo=memo,
        search_attributes=desc.typed_search_attributes,
    )


def run_from_result(result: RolloutResult, task: Task | None, job_id: str,
                    store: TraceStore | None) -> Run:
    """A Run from a compact result, its trace (and prompt) loaded from ``store`` when given."""
    trace = None
    if store is not None and result.trace_ref is not None:
        with contextlib.suppress(OSError, ValueError):
            trace = store.get(result.trace_ref)
    run = Run.from_result(result, trace, task=task, job_id=job_id)
    if trace is not None and trace.steps and trace.steps[0].task_call is not None:
        prompt = trace.steps[0].task_call.result
        run.prompt = prompt if isinstance(prompt, dict) else {}
    return run


async def batch_descriptions(client: Client, job_id: str) -> list[Any]:
    """The current run of every batch of ``job_id`` (``describe()`` results, batch 0 first)."""
    found = []
    while (desc := await describe(client, workflow_id(job_id, len(found)))) is not None:
        found.append(desc)
    return found


async def load_job(client: Client, job_id: str, *, traces: bool = False) -> JobView:
    """Every batch of ``job_id`` with one Run per rollout (traces loaded when ``traces``).

    Raises:
        ConfigError: no job with that id.
    """
    for candidate in workflow_ids(job_id):
        descs = await batch_descriptions(client, candidate)
        batches = [await _batch(client, candidate, i, d, traces) for i, d in enumerate(descs)]
        if batches:
            return JobView(job_id=candidate, batches=batches)
    raise ConfigError(f"no job with id {job_id!r} (list recent jobs with `rollouts jobs`)")


async def child_task(client: Client, rid: str) -> Task | None:
    """The (resolved) task a Rollout child ran, read from its start event; None if there is none."""
    try:
        inp = await read_input(client, rid, None, RolloutInput)
    except (RPCError, ConfigError):
        return None
    return inp.task if isinstance(inp, RolloutInput) else None
