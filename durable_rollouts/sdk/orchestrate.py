"""Start, await and inspect durable batches: ``run_taskset``, ``start_job``, ``get_job``.

``run_taskset`` turns a Taskset + Agent + runtime into one ``TasksetRun`` workflow (a batch of a
``Job``), waits for it and returns the Job with graded runs (traces loaded from the trace store,
never from workflow history). With no Temporal address (argument or ``ROLLOUTS_TEMPORAL_ADDRESS``)
it uses the embedded dev server plus an in-process worker that shares the caller's ``sys.path``,
so classes defined by the caller import. The in-process worker lives as long as the event loop and
is reused by later calls (a training loop pays its start-up once); ``shutdown_embedded()`` stops it.

Imports the sdk, the workflows (for names and input models), the activities (only to build the
in-process worker) and temporalio.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import RolloutResult, Task
from durable_rollouts.sdk.agents import check_remote
from durable_rollouts.sdk.job import Job, mark_dropped
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.temporal import connect_client, ensure_search_attributes, resolve_address
from durable_rollouts.sdk.tracestore import TraceStore
from durable_rollouts.sdk.validation import validate_batch
from durable_rollouts.workflows import TasksetRun, workflow_id
from durable_rollouts.workflows.types import (
    DEFAULT_TASK_QUEUE,
    MAX_CONCURRENT,
    ON_ERROR_POLICIES,
    Progress,
    TasksetRunInput,
    TasksetRunResult,
)

__all__ = ["JobHandle", "check_policy", "get_job", "job_progress", "run_taskset", "shutdown_embedded", "start_job"]

QUEUE_ENV = "ROLLOUTS_TASK_QUEUE"
INLINE_ROWS = 200  # above this many rows, the workflow input carries a file reference instead


# ---------------------------------------------------------------------------------------------
# Clients and the in-process worker (cached per event loop)


@dataclass
class _Embedded:
    loop: asyncio.AbstractEventLoop
    client: Client
    worker: Any = None
    task: asyncio.Task[Any] | None = None


_CLIENTS: dict[tuple[int, str | None], _Embedded] = {}


async def _client(temporal: Any) -> tuple[Client, bool]:
    """(client, embedded?) for ``temporal``: a Client, an address, or None (env var / embedded)."""
    if isinstance(temporal, Client):
        return temporal, False
    address = resolve_address(temporal)
    loop = asyncio.get_running_loop()
    key = (id(loop), address)
    entry = _CLIENTS.get(key)
    if entry is None or entry.loop is not loop:
        entry = _Embedded(loop=loop, client=await connect_client(address))
        _CLIENTS[key] = entry
    return entry.client, address is None


async def _ensure_worker(client: Client, task_queue: str) -> None:
    from durable_rollouts.worker import build_worker  # lazy: activities pull in the whole sdk

    loop = asyncio.get_running_loop()
    key = (id(loop), f"worker:{id(client)}:{task_queue}")
    entry = _CLIENTS.get(key)
    if entry is not None and entry.loop is loop and entry.task is not None and not entry.task.done():
        return
    worker = build_worker(client, task_queue=task_queue)
    entry = _Embedded(loop=loop, client=client, worker=worker)
    entry.task = asyncio.ensure_future(worker.run())
    _CLIENTS[key] = entry


async def shutdown_embedded() -> None:
    """Stop the in-process workers started by this module on the running loop."""
    loop = asyncio.get_running_loop()
    for key, entry in list(_CLIENTS.items()):
        if entry.loop is loop and entry.worker is not None:
            await entry.worker.shutdown()
            _CLIENTS.pop(key, None)


# ---------------------------------------------------------------------------------------------
# Starting a batch


_KEYS = {name: SearchAttributeKey.for_keyword(name) for name in (
    "RolloutsJobId", "RolloutsJobName", "RolloutsTaskset", "RolloutsAgent", "RolloutsStatus")}


@dataclass
class JobHandle:
    """A started batch: query its progress, wait for it, cancel it."""

    job: Job
    batch_index: int
    handle: WorkflowHandle[Any, TasksetRunResult]
    rows: list[Task]
    trace_store: TraceStore | None = None

    @property
    def workflow_id(self) -> str:
        return self.handle.id

    async def progress(self) -> Progress:
        return await self.handle.query(TasksetRun.progress)

    async def cancel(self) -> None:
        await self.handle.cancel()

    async def wait(self) -> Job:
        """Wait for the batch and append its runs (expansion order) to the job."""
        result = await self.handle.result()
        self.job.runs.extend(runs_from_result(result, self.job.id, self.rows, self.trace_store))
        return self.job


def runs_from_result(result: TasksetRunResult, job_id: str, rows: list[Task] | None = None,
                     store: TraceStore | None = None) -> list[Run]:
    """Runs of a finished batch, in expansion order, traces loaded from the store."""
    from durable_rollouts.activities.taskset import ResultStore

    results: list[RolloutResult] = [r for ref in result.result_refs for r in ResultStore.get(ref)]
    results += result.results
    latest: dict[str, RolloutResult] = {}
    for r in results:  # a rollout re-run within the batch: the latest result wins
        latest[r.rollout_id] = r
    results = sorted(latest.values(), key=lambda r: (r.row_index, r.group_index))
    store = store or TraceStore()
    runs = []
    for r in results:
        trace = None
        if r.trace_ref is not None:
            with contextlib.suppress(OSError, ValueError):
                trace = store.get(r.trace_ref)
        task = rows[r.row_index] if rows is not None and r.row_index < len(rows) else None
        run = Run.from_result(r, trace, task=task, job_id=job_id)
        if trace is not None and trace.steps and trace.steps[0].task_call is not None:
            prompt = trace.steps[0].task_call.result
            run.prompt = prompt if isinstance(prompt, dict) else {}
        runs.append(run)
    mark_dropped(runs, result.on_error)
    return runs


def check_policy(retries: int, on_error: str) -> str:
    """Validate a batch policy; ``drop-group`` (the CLI spelling) means ``drop_group``.

    Raises:
        ConfigError: a negative/too large ``retries`` or an unknown ``on_error``.
    """
    policy = on_error.replace("-", "_")
    if policy not in ON_ERROR_POLICIES:
        raise ConfigError(f"on_error={on_error!r}: use keep, drop_group or fail")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        raise ConfigError(f"retries={retries!r}: use a whole number from 0 to 20")
    return policy


async def start_job(taskset: Any, agent: Any, *, runtime: Any, group: int | None = None, max_concurrent: int = 16,
                    job: Job | None = None, rollout_timeout: float | None = None, temporal: Any = None,
                    name: str | None = None, task_queue: str | None = None, worker: bool | None = None,
                    max_attempts: int = 3, trace_store: TraceStore | None = None,
                    max_history_events: int | None = None, retries: int = 0,
                    on_error: str = "keep") -> JobHandle:
    """Start one batch (a ``TasksetRun`` workflow) and return its handle without waiting.

    Args:
        retries: fresh re-runs (new substrate, same group) of an errored or timed-out rollout.
        on_error: what an error left after retries means: ``keep``, ``drop_group`` (the group is
            exported with ``dropped: true`` and left out of stats) or ``fail`` (cancel the rest).
        worker: run an in-process worker (default: only with the embedded dev server).
        task_queue: the shared queue (default ``$ROLLOUTS_TASK_QUEUE`` or ``rollouts``).
    """
    from durable_rollouts.activities.taskset import register_taskset, taskset_class_path

    rows = list(taskset)
    group = Job.batch_group(group, job)
    on_error = check_policy(retries, on_error)
    validate_batch(rows, runtime=runtime, group=group, max_concurrent=max_concurrent,
                   rollout_timeout=rollout_timeout, agent_timeout=getattr(agent, "timeout_s", None))
    if not rows:
        raise ConfigError(f"taskset {taskset.name!r} has no rows")
    agent_spec = agent.spec()
    provider_spec = runtime.spec()
    client, embedded = await _client(temporal)
    queue = task_queue or os.environ.get(QUEUE_ENV) or DEFAULT_TASK_QUEUE
    if worker if worker is not None else embedded:
        await _ensure_worker(client, queue)
    else:
        check_remote(agent_spec)  # the agent must import on workers outside this process
    attrs_ok = await ensure_search_attributes(client)

    name = name or (job.name if job is not None else taskset.name)
    if job is None:
        job = Job(name=name, group=group, taskset=taskset.name)
    batch_index = job.batches
    job.batches += 1
    job.agent = agent_spec
    register_taskset(taskset)
    rows_ref = None
    if len(rows) > INLINE_ROWS:  # keep the workflow input small: rows go by claim check
        from durable_rollouts.activities.taskset import ResultStore

        rows_ref = ResultStore().put_rows(job.id, batch_index, rows)
    inp = TasksetRunInput(
        job_id=job.id, job_name=name, batch_index=batch_index, taskset_name=taskset.name,
        taskset_class=taskset_class_path(taskset), rows=[] if rows_ref else rows,
        rows_ref=rows_ref, total_rows=len(rows), group=group,
        max_concurrent=min(max_concurrent, MAX_CONCURRENT), agent=agent_spec, provider=provider_spec,
        rollout_timeout_s=rollout_timeout, max_attempts=max_attempts, task_queue=queue,
        search_attributes=attrs_ok, retries=retries, on_error=on_error,  # type: ignore[arg-type]
        local_steps=getattr(runtime, "locality", "global") in ("process", "host"),
        **({"max_history_events": max_history_events, "flush_results_over": 0}
           if max_history_events else {}),
    )
    attrs = None
    if attrs_ok:
        attrs = TypedSearchAttributes([
            SearchAttributePair(_KEYS["RolloutsJobId"], job.id),
            SearchAttributePair(_KEYS["RolloutsJobName"], name),
            SearchAttributePair(_KEYS["RolloutsTaskset"], taskset.name),
            SearchAttributePair(_KEYS["RolloutsAgent"], agent_spec.path),
            SearchAttributePair(_KEYS["RolloutsStatus"], "running"),
        ])
    handle = await client.start_workflow(
        TasksetRun.run, inp, id=workflow_id(job.id, batch_index), task_queue=queue,
        search_attributes=attrs, memo={"job_name": name, "taskset": taskset.name, "group": group},
        static_summary=f"{name}: {len(rows)} tasks x {group}",
    )
    return JobHandle(job=job, batch_index=batch_index, handle=handle, rows=rows, trace_store=trace_store)


async def run_taskset(taskset: Any, agent: Any, *, runtime: Any, group: int | None = None, max_concurrent: int = 16,
                      job: Job | None = None, rollout_timeout: float | None = None, temporal: Any = None,
                      name: str | None = None, wait: bool = True, **kwargs: Any) -> Any:
    """Run every row ``group`` times durably; returns the Job (or a JobHandle if ``wait=False``).

    See ``start_job`` for the extra keyword arguments (task_queue, worker, max_attempts, trace_store).
    """
    handle = await start_job(taskset, agent, runtime=runtime, group=group, max_concurrent=max_concurrent,
                             job=job, rollout_timeout=rollout_timeout, temporal=temporal, name=name,
                             **kwargs)
    if not wait:
        return handle
    return await handle.wait()


# ---------------------------------------------------------------------------------------------
# Inspecting jobs


async def _batches(client: Client, job_id: str) -> list[WorkflowHandle[Any, TasksetRunResult]]:
    handles = []
    index = 0
    while True:
        handle = client.get_workflow_handle_for(TasksetRun.run, workflow_id(job_id, index))
        try:
            await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                break
            raise
        handles.append(handle)
        index += 1
    return handles


async def job_progress(job_id: str, temporal: Any = None) -> list[Progress]:
    """The ``progress`` of every batch of a job (running or finished)."""
    client, _ = await _client(temporal)
    return [await h.query(TasksetRun.progress) for h in await _batches(client, job_id)]


async def get_job(job_id: str, temporal: Any = None, *, wait: bool = False) -> Job:
    """Rebuild a Job from its finished batches (``wait=True`` also waits for running ones)."""
    client, _ = await _client(temporal)
    handles = await _batches(client, job_id)
    if not handles:
        raise ConfigError(f"no job with id {job_id!r}")
    job: Job | None = None
    for handle in handles:
        desc = await handle.describe()
        if job is None:
            memo = await desc.memo()
            job = Job(id=job_id, name=str(memo.get("job_name", job_id)), group=int(memo.get("group", 1)),
                      taskset=memo.get("taskset"))
        job.batches += 1
        if desc.status == WorkflowExecutionStatus.RUNNING and not wait:
            continue
        if desc.status not in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED,
                               WorkflowExecutionStatus.CONTINUED_AS_NEW):
            continue
        _merge(job.runs, runs_from_result(await handle.result(), job_id))
    assert job is not None
    return job


def _merge(runs: list[Run], new: list[Run]) -> None:
    """Append ``new``; a run whose rollout id is already there replaces it (a resumed rollout)."""
    where = {run.rollout_id: i for i, run in enumerate(runs)}
    for run in new:
        if run.rollout_id in where:
            runs[where[run.rollout_id]] = run
        else:
            where[run.rollout_id] = len(runs)
            runs.append(run)
