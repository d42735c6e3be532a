"""Start, await and inspect durable batches: ``run_taskset``, ``start_job``, ``get_job``.

This is what ``Taskset.run`` calls (by name, from ``sdk.taskset``). Reading a job goes through
``temporal.jobs`` (the one reader the CLI uses too).

``run_taskset`` turns a Taskset + Agent + runtime into one ``TasksetRun`` workflow (a batch of a
``Job``), waits for it and returns the Job with graded runs (traces loaded from the trace store,
never from workflow history). With no Temporal address (argument or ``ROLLOUTS_TEMPORAL_ADDRESS``)
it uses the embedded dev server plus an in-process worker that shares the caller's ``sys.path``,
so classes defined by the caller import. The in-process worker runs while a batch uses it (from
``start_job`` until ``JobHandle.wait`` returns or ``JobHandle.release``) or a ``session()`` block is
open, and is shut down before that call returns (``sdk.lifetime``): nothing is left for
``asyncio.run``'s final cancellation, which would wedge a temporalio Worker (issue #16).

Imports the sdk, the workflows (for names and input models), the activities (only to build the
in-process worker) and temporalio.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from durable_rollouts.capacity import slots_for
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.release import MEMO_KEY, release_name
from durable_rollouts.sdk import lifetime
from durable_rollouts.sdk.agents import as_agent, check_remote
from durable_rollouts.sdk.job import Job, mark_dropped
from durable_rollouts.sdk.placement import check_remote_provider
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.validation import validate_batch
from durable_rollouts.settings import MAX_CHILDREN_PER_WORKFLOW, settings
from durable_rollouts.stores.row_pages import MAX_EPOCHS, check_epochs, order_seed, store_rows
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.temporal.connection import (
    connect_client,
    ensure_search_attributes,
    resolve_address,
)
from durable_rollouts.temporal.jobs import (
    batch_descriptions,
    dedupe_latest,
    load_job,
    load_results,
    run_from_result,
)
from durable_rollouts.temporal.parts import batch_progress
from durable_rollouts.temporal.queues import batch_queue
from durable_rollouts.workflows import TasksetRun, workflow_id
from durable_rollouts.workflows.stream import PolicyRef, StreamOptions
from durable_rollouts.workflows.types import (
    MAX_CONCURRENT,
    ON_ERROR_POLICIES,
    Progress,
    TasksetRunInput,
    TasksetRunResult,
)

__all__ = ["JobHandle", "check_policy", "get_job", "job_progress", "run_taskset", "shutdown_embedded", "start_job"]

INLINE_ROWS = 1000  # above this many rows, the workflow input carries a storage reference instead
INLINE_ROWS_BYTES = 256 * 1024  # ... or above this many bytes of rows


# ---------------------------------------------------------------------------------------------
# Clients and the in-process worker (cached per event loop)


@dataclass
class _Embedded:
    loop: asyncio.AbstractEventLoop
    client: Client


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


async def _ensure_worker(client: Client, task_queue: str, max_concurrent: int | None = None) -> lifetime.Lease:
    """A lease on this loop's in-process worker for ``task_queue`` with room for
    ``max_concurrent`` more rollouts (``capacity.slots_for``): the running one if its slots hold
    them on top of its other batches'; an idle one too narrow is replaced by a wider one, a busy
    one warns (``lifetime.lease_wide``); never a silent cap."""
    from durable_rollouts.worker import build_worker  # lazy: activities pull in the whole sdk

    slots = slots_for(max_concurrent)
    return await lifetime.lease_wide((id(client), task_queue), max_concurrent or 0,
                                     lambda: build_worker(client, task_queue=task_queue,
                                                          max_concurrent_activities=slots))


async def shutdown_embedded() -> None:
    """Stop the in-process workers started by this module on the running loop."""
    await lifetime.stop_all()


# ---------------------------------------------------------------------------------------------
# Starting a batch


_KEYS = {name: SearchAttributeKey.for_keyword(name) for name in (
    "RolloutsJobId", "RolloutsJobName", "RolloutsTaskset", "RolloutsAgent", "RolloutsStatus")}


def _search_attributes(job_id: str, name: str, taskset: str, agent: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([
        SearchAttributePair(_KEYS["RolloutsJobId"], job_id),
        SearchAttributePair(_KEYS["RolloutsJobName"], name),
        SearchAttributePair(_KEYS["RolloutsTaskset"], taskset),
        SearchAttributePair(_KEYS["RolloutsAgent"], agent),
        SearchAttributePair(_KEYS["RolloutsStatus"], "running"),
    ])


@dataclass
class JobHandle:
    """A started batch: query its progress, wait for it, cancel it.

    With an in-process worker the handle holds a lease on it: ``wait()`` gives it back when it
    returns or raises (and takes a new one if called again); ``release()`` gives it back without
    waiting (the batch then needs another worker to progress).
    """

    job: Job
    batch_index: int
    handle: WorkflowHandle[Any, TasksetRunResult]
    rows: list[Task]
    trace_store: TraceStore | None = None
    lease: lifetime.Lease | None = None
    relet: Callable[[], Awaitable[lifetime.Lease]] | None = None
    rows_ref: str | None = None  # paged rows in another order than ``rows`` (epochs, a seed)

    @property
    def workflow_id(self) -> str:
        return self.handle.id

    async def progress(self) -> Progress:
        """The batch's progress (a query: with no lease held, a worker runs just for it)."""
        if self.lease is not None or self.relet is None:
            return await batch_progress(self.handle)
        lease = await self.relet()
        try:
            return await batch_progress(self.handle)
        finally:
            await lease.release()

    async def cancel(self) -> None:
        await self.handle.cancel()

    async def wait(self) -> Job:
        """Wait for the batch and append its runs (expansion order) to the job."""
        if self.lease is None and self.relet is not None:
            self.lease = await self.relet()
        try:
            result = await self.handle.result()
        finally:
            await self.release()
        rows = self.rows
        if self.rows_ref is not None:  # each position's row (its epoch's order), up to the last run
            from durable_rollouts.stores.results import ResultStore

            top = 1 + max((r.row_index for r in load_results(result.result_refs, result.results)),
                          default=-1)
            rows = await asyncio.to_thread(ResultStore.get_rows, self.rows_ref, 0, top)
        self.job.runs.extend(runs_from_result(result, self.job.id, rows, self.trace_store))
        return self.job

    async def release(self) -> None:
        """Give back the lease on the in-process worker (it stops when nothing else uses it)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.release()


def runs_from_result(result: TasksetRunResult, job_id: str, rows: list[Task] | None = None,
                     store: TraceStore | None = None) -> list[Run]:
    """Runs of a finished batch, in expansion order, traces loaded from the store."""
    latest = dedupe_latest(load_results(result.result_refs, result.results))  # a re-run: latest wins
    store = store or TraceStore()
    runs = [
        run_from_result(r, rows[r.row_index] if rows is not None and r.row_index < len(rows) else None,
                        job_id, store)
        for r in sorted(latest.values(), key=lambda r: (r.row_index, r.group_index))
    ]
    mark_dropped(runs, result.on_error)
    return runs


def check_width(max_concurrent: int, *, streamed: bool, group: int = 1, open_ended: bool = False) -> None:
    """A batch wider than one workflow holds runs as parts (``workflows.fan_out``; a streamed one,
    ``workflows.stream_parts``, whole groups to a part); no batch goes past ``MAX_CONCURRENT``.

    Raises:
        ConfigError: naming the limit and its knob.
    """
    per_workflow = settings().children_per_workflow
    if streamed and max_concurrent > per_workflow and (open_ended or group > per_workflow):
        why = ("an open-ended one (epochs=None) runs in one workflow" if open_ended else
               f"its parts hold whole groups, and group={group} is more than one part holds")
        raise ConfigError(
            f"max_concurrent={max_concurrent}: a streamed batch wider than {per_workflow} rollouts "
            f"runs as parts, but {why} (one workflow's share of Temporal's 2,000 pending children: "
            f"ROLLOUTS_CHILDREN_PER_WORKFLOW, up to {MAX_CHILDREN_PER_WORKFLOW})")
    if max_concurrent > MAX_CONCURRENT:
        raise ConfigError(f"max_concurrent={max_concurrent}: a batch keeps at most {MAX_CONCURRENT:,} "
                          "rollouts in flight")


def check_policy(retries: int, on_error: str) -> str:
    """Validate a batch policy; ``drop-group`` (the CLI spelling) means ``drop_group``.

    Raises:
        ConfigError: a negative/too large ``retries`` or an unknown ``on_error``.
    """
    policy = on_error.replace("-", "_")
    if policy not in ON_ERROR_POLICIES:
        raise ConfigError(f"on_error={on_error!r}: use keep, drop_group, drop_sample or fail")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        raise ConfigError(f"retries={retries!r}: use a whole number from 0 to 20")
    return policy


async def start_job(taskset: Any, agent: Any, *, runtime: Any, group: int | None = None, max_concurrent: int = 16,
                    job: Job | None = None, rollout_timeout: float | None = None, temporal: Any = None,
                    name: str | None = None, task_queue: str | None = None, worker: bool | None = None,
                    max_attempts: int = 3, trace_store: TraceStore | None = None,
                    max_history_events: int | None = None, retries: int = 0,
                    on_error: str = "keep", stream: StreamOptions | None = None,
                    policy: PolicyRef | None = None, epochs: int | None = 1,
                    seed: int | None = None) -> JobHandle:
    """Start one batch (a ``TasksetRun`` workflow) and return its handle without waiting.

    Args:
        retries: fresh re-runs (new substrate, same group) of an errored or timed-out rollout.
        on_error: what an error left after retries means: ``keep``, ``drop_group`` (the group is
            exported with ``dropped: true`` and left out of stats) or ``fail`` (cancel the rest).
        worker: run an in-process worker (default: only with the embedded dev server).
        task_queue: the queue (default: with an in-process worker, the job's own queue
            ``rollouts-job-<id>``; else ``$ROLLOUTS_TASK_QUEUE`` or ``rollouts``; see ``queues``).
        stream: keep finished groups for consumers and pace against them (``Taskset.start``).
        policy: the policy the first rollouts sample with.
        epochs: run the rows this many times, each epoch (with ``seed``, or when ``epochs > 1``)
            in its own order drawn from ``seed`` (default 0); see ``stores.row_pages``. None
            (a streamed batch only): epoch after epoch until ``job.close()``.
        seed: the seed of the epochs' orders (None with ``epochs=1``: the taskset's order).
    """
    check_epochs(epochs, seed, streamed=stream is not None)
    seed = order_seed(epochs, seed)
    rows = list(taskset)
    agent = as_agent(agent)  # ours, or a HUD v6 agent (wrapped: it travels as its own class path)
    group = Job.batch_group(group, job)
    on_error = check_policy(retries, on_error)
    validate_batch(rows, runtime=runtime, group=group, max_concurrent=max_concurrent,
                   rollout_timeout=rollout_timeout, agent_timeout=getattr(agent, "timeout_s", None))
    if not rows:
        raise ConfigError(f"taskset {taskset.name!r} has no rows")
    check_width(max_concurrent, streamed=stream is not None, group=group, open_ended=epochs is None)
    agent_spec = agent.spec()
    provider_spec = runtime.spec()
    client, embedded = await _client(temporal)
    in_process = worker if worker is not None else embedded
    if job is None:
        job = Job(name=name or taskset.name, group=group, taskset=taskset.name)
    queue = batch_queue(task_queue, job_id=job.id, in_process=in_process)  # ours, unless chosen
    relet = None
    if in_process:
        relet = functools.partial(_ensure_worker, client, queue, max_concurrent)
    else:
        check_remote(agent_spec)  # the agent must import on workers outside this process
        check_remote_provider(provider_spec)  # ... and the runtime must reach them
    lease = await relet() if relet is not None else None
    try:
        handle = await _start(taskset, agent_spec, provider_spec, runtime, rows, client, queue, group=group,
                              max_concurrent=max_concurrent, job=job, rollout_timeout=rollout_timeout,
                              name=name, max_attempts=max_attempts, trace_store=trace_store,
                              max_history_events=max_history_events, retries=retries,
                              on_error=on_error, eager=lease is not None, stream=stream, policy=policy,
                              epochs=epochs, seed=seed)
    except BaseException:
        if lease is not None:
            await lease.release()
        raise
    handle.lease, handle.relet = lease, relet
    return handle


async def _start(taskset: Any, agent_spec: Any, provider_spec: Any, runtime: Any, rows: list[Task],
                 client: Client, queue: str, *, group: int, max_concurrent: int, job: Job | None,
                 rollout_timeout: float | None, name: str | None, max_attempts: int,
                 trace_store: TraceStore | None, max_history_events: int | None, retries: int = 0,
                 on_error: str = "keep", eager: bool = False, stream: StreamOptions | None = None,
                 policy: PolicyRef | None = None, epochs: int | None = 1,
                 seed: int | None = None) -> JobHandle:
    """Start the ``TasksetRun`` workflow of a validated batch.

    ``eager``: this process runs a worker on ``queue`` with this client, so ask the server to
    hand it the first workflow task in the start response (eager workflow start: no dispatch
    through matching; a server or worker that cannot, starts it as usual).
    """
    from durable_rollouts.sdk.taskset import register_taskset, taskset_class_path

    attrs_ok = await ensure_search_attributes(client)

    name = name or (job.name if job is not None else taskset.name)
    if job is None:
        job = Job(name=name, group=group, taskset=taskset.name)
    batch_index = job.batches
    job.batches += 1
    job.agent = agent_spec
    register_taskset(taskset)
    rows_ref = None
    open_ended = epochs is None  # epoch after epoch (up to MAX_EPOCHS) until the stream closes
    epochs = MAX_EPOCHS if epochs is None else epochs
    # keep the workflow input (and every continue-as-new carry) small: rows go by claim check,
    # as pages (row_pages) the workflow loads a window at a time; so do epochs
    if (epochs > 1 or seed is not None or len(rows) > INLINE_ROWS
            or sum(len(r.model_dump_json()) for r in rows) > INLINE_ROWS_BYTES):
        rows_ref = await asyncio.to_thread(_put_pages, rows, epochs, seed)
    per_workflow = settings().children_per_workflow
    inp = TasksetRunInput(
        job_id=job.id, job_name=name, batch_index=batch_index, taskset_name=taskset.name,
        taskset_class=taskset_class_path(taskset), rows=[] if rows_ref else rows,
        rows_ref=rows_ref, total_rows=len(rows) * epochs, group=group,
        max_concurrent=max_concurrent, children_per_workflow=per_workflow, agent=agent_spec, provider=provider_spec,
        rollout_timeout_s=rollout_timeout, max_attempts=max_attempts, task_queue=queue,
        search_attributes=attrs_ok, retries=retries, on_error=on_error,  # type: ignore[arg-type]
        local_steps=getattr(runtime, "locality", "global") in ("process", "host"),
        ephemeral=bool(getattr(runtime, "ephemeral", False)),
        admission=getattr(runtime, "admission", None),
        queue_timeout_s=settings().queue_timeout, agent_heartbeat_s=settings().agent_heartbeat_s,
        worker_watch=settings().worker_watch > 0,
        stream=stream, policy=policy, open_ended=open_ended,
        **({"max_history_events": max_history_events, "flush_results_over": 0}
           if max_history_events else {}),
    )
    attrs = _search_attributes(job.id, name, taskset.name, agent_spec.path) if attrs_ok else None
    handle = await client.start_workflow(
        TasksetRun.run, inp, id=workflow_id(job.id, batch_index), task_queue=queue,
        search_attributes=attrs, memo={"job_name": name, "taskset": taskset.name, "group": group,
                                          MEMO_KEY: release_name()},
        static_summary=f"{name}: {len(rows)} tasks x {group}" + (
            " until closed" if open_ended else f" x {epochs} epochs" if epochs > 1 else ""),
        request_eager_start=eager,
    )
    return JobHandle(job=job, batch_index=batch_index, handle=handle, rows=rows, trace_store=trace_store,
                     rows_ref=rows_ref if seed is not None else None)


def _put_pages(rows: list[Task], epochs: int, seed: int | None) -> str:
    """Store ``rows`` as pages and their manifest (``row_pages``); the manifest's uri."""
    from durable_rollouts.temporal import storage

    store = storage.blobs()
    return store_rows(rows, store.put, epochs=epochs, seed=seed)


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


async def job_progress(job_id: str, temporal: Any = None) -> list[Progress]:
    """The ``progress`` of every batch of a job (running or finished)."""
    client, embedded = await _client(temporal)
    progress = []
    for desc in await batch_descriptions(client, job_id):
        lease = None
        if embedded:  # queries need a worker: on the embedded server, ours on the batch's queue
            lease = await _ensure_worker(client, desc.task_queue)
        try:
            progress.append(await batch_progress(client.get_workflow_handle(desc.id)))
        finally:
            if lease is not None:
                await lease.release()
    return progress


async def get_job(job_id: str, temporal: Any = None, *, wait: bool = False) -> Job:
    """Rebuild a Job from its finished batches (``wait=True`` also waits for running ones).

    Reads through ``temporal.jobs.load_job``; only completed batches contribute runs (a running
    one counts in ``job.batches`` and is waited for with ``wait``; a failed or cancelled one
    adds no runs).
    """
    client, _ = await _client(temporal)
    if wait:
        for desc in await batch_descriptions(client, job_id):
            if desc.status == WorkflowExecutionStatus.RUNNING:
                await client.get_workflow_handle_for(TasksetRun.run, desc.id).result()
    try:
        view = await load_job(client, job_id, traces=True)
    except ConfigError:
        raise ConfigError(f"no job with id {job_id!r}") from None
    job = view.job()
    job.runs = [run for batch in view.batches if batch.status == "completed" for run in batch.runs]
    return job
