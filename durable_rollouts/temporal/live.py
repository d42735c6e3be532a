"""A live job for a trainer: stream finished groups, acknowledge them, publish the policy.

``Taskset.start(...)`` returns a :class:`LiveJob` at once (its batch runs on Temporal);
``Job.attach(job_id)`` gets one back after a trainer restart. ``job.stream(consumer=...)`` reads
the batch's finished groups in completion order (the ``stream_view`` query: nothing written) and
yields them ``batch_size`` at a time; ``await batch.ack()`` records the acknowledgement in the
batch's workflow (the ``stream_ack`` update), so a consumer that restarts under the same name
gets every unacknowledged group again and never an acknowledged one, and no rollout runs again.
``job.set_policy(version, endpoint=...)`` is an update too: new rollouts sample with it.
``job.add(taskset)`` (or ``Taskset.start(agent, job=job)``) gives the running job further rows:
one job, one stream, for as long as a trainer runs.
Imports temporalio, the workflow names and models, and the sdk's Job/Run; never the CLI.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from ..backoff import retry
from ..errors import ConfigError, DurableRolloutsError
from ..sdk.job import Job
from ..sdk.run import Run
from ..settings import settings
from ..stores.tracestore import TraceStore
from ..stores.row_pages import check_epochs, order_seed
from ..workflows import TasksetRun, TasksetRunInput, TasksetRunResult, workflow_id
from ..workflows.stream import (
    SEALED,
    AckRequest,
    FinishedGroup,
    PolicyRef,
    StreamOptions,
    StreamRequest,
    StreamView,
    check_consumer,
)
from ..workflows.types import AddedRows, AddRows
from .batches import JobHandle, _client, _ensure_worker, _put_pages, start_job
from .jobs import run_from_result
from .open_run import HandedOver, query_open
from .stream_reader import Chunk, JobClosedError, StreamReader

__all__ = ["JobClosedError", "LiveJob", "StreamBatch", "UpdateTimeoutError", "attach", "start_live"]

POLL_S = 0.5  # how often a stream asks for new groups where the batch cannot wake it
# A stream reads up to this many groups per query when its batch size is smaller, and hands them
# out a batch at a time: a consumer behind the batch then pays one query per 16 groups instead of
# one per batch (each ack is still its own update). Bounded so a reply of groups of 16 long
# answers stays far below gRPC's 4 MiB message limit.
READ_AHEAD_GROUPS = 16
UPDATE_PATIENCE_S = 120.0  # how long an update the running batch cannot take yet is sent again


def carve(chunk: Chunk, full: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each batch of ``full`` groups in ``chunk``, in order; the last one may
    be short only where the stream ends (the job is done and ``chunk`` reaches its last group)."""
    end = chunk.start + len(chunk.groups)
    cuts = list(range(chunk.start, end, full))
    spans = [(a, min(a + full, end)) for a in cuts]
    if spans and spans[-1][1] - spans[-1][0] < full and not (chunk.done and end >= chunk.delivered):
        spans.pop()  # a short batch only at the end of the stream: read it again once full
    return spans


def _checked(consumer: str) -> str:
    """``consumer`` if it is a valid consumer name, else ConfigError saying what is allowed."""
    try:
        return check_consumer(consumer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass
class StreamBatch:
    """Finished groups, in completion order: ``groups[i]`` are the kept rollouts of one group.

    ``sizes[i]`` is the size that group counts as (its kept samples, for advantages);
    ``records`` the stream's own records (group ids, dropped samples, policy versions).
    """

    job: LiveJob
    consumer: str
    start: int
    end: int
    records: list[FinishedGroup]
    groups: list[list[Run]] = field(default_factory=list)
    recorded: bool = True  # acknowledgements are recorded (in storage once the job has closed)
    reader: StreamReader | None = None

    @property
    def id(self) -> str:
        return f"{self.consumer}:{self.start}-{self.end}"

    @property
    def sizes(self) -> list[int]:
        return [r.size for r in self.records]

    async def ack(self, wait: bool = True) -> int:
        """Acknowledge these groups (durable when it returns); returns the consumer's cursor.

        ``wait=False`` returns at once: the ack is recorded behind the one in flight, together
        with every other sent meanwhile (one update for them all), and is durable once a later
        awaited ack returns or the stream ends; until then a restarted consumer gets these groups
        again. On a job that has closed (its consumers caught up, or it lingered out) the
        acknowledgement is stored next to the stream's pages, under the same rules."""
        if self.reader is None:
            return int(await self.job._update("stream_ack", AckRequest(
                consumer=self.consumer, start=self.start, end=self.end)))
        return await self.reader.ack(self.start, self.end, wait=wait)


_BUSY = {RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED}


def _busy(exc: Exception) -> bool:
    """A query the server or the worker could not take now (or a run that closed as it came),
    not a wrong one."""
    return isinstance(exc, HandedOver) or (isinstance(exc, RPCError) and exc.status in _BUSY)


class UpdateTimeoutError(DurableRolloutsError, TimeoutError):
    """The running batch did not take an acknowledgement or policy within ``UPDATE_PATIENCE_S``."""


class LiveJob(Job):
    """A running job: its batch's handle, plus stream, ack and policy calls."""

    def __init__(self, handle: JobHandle, client: Client) -> None:
        base = handle.job
        super().__init__(id=base.id, name=base.name, group=base.group, taskset=base.taskset)
        self.batches, self.agent = base.batches, base.agent
        self.handle = handle
        self.client = client
        self.store = handle.trace_store or TraceStore()

    @property
    def _workflow(self) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(workflow_id(self.id, self.handle.batch_index))

    async def _update(self, name: str, arg: Any) -> Any:
        """Run update ``name``; a refused one is a ConfigError with the workflow's reason.

        While the batch runs, an update the server cannot take yet (the run is continuing as
        new, or its workflow task failed, e.g. a starved worker tripped the deadlock detector,
        and waits for the server's retry) is sent again for up to ``UPDATE_PATIENCE_S``."""
        deadline = time.monotonic() + UPDATE_PATIENCE_S
        for tries in itertools.count():
            try:
                return await self._workflow.execute_update(name, arg)
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause
                message = str(getattr(cause, "message", None) or cause or exc)
                if SEALED in message:  # the batch is closing: storage takes it from here
                    raise JobClosedError(f"job {self.id} is closing: {message}") from exc
                raise ConfigError(message) from exc
            except WorkflowUpdateRPCTimeoutOrCancelledError as exc:
                if isinstance(exc.__cause__, asyncio.CancelledError):  # temporalio's name for a
                    raise asyncio.CancelledError() from exc  # cancelled caller (Ctrl-C, SIGTERM)
                raise
            except RPCError as exc:
                if not await self._running():
                    raise JobClosedError(f"job {self.id} has closed: {exc.message}") from exc
                if time.monotonic() >= deadline:
                    raise UpdateTimeoutError(f"job {self.id} did not take the {name} update within "
                                             f"{UPDATE_PATIENCE_S:.0f} s: {exc.message}") from exc
                await asyncio.sleep(min(0.2 * (tries + 1), 2.0))
        raise AssertionError("unreachable")

    async def _running(self) -> bool:
        desc = await self._workflow.describe()
        return desc.status == WorkflowExecutionStatus.RUNNING

    async def view(self, consumer: str, start: int, limit: int) -> StreamView:
        """What ``consumer`` can read from ``start`` (a query). A busy batch (the server's
        consistent-query buffer full, the worker slow to answer) is asked again, with backoff, for
        up to ``UPDATE_PATIENCE_S``: a trainer reading a long, busy job must not die of it."""
        request = StreamRequest(consumer=consumer, start=start, limit=limit)
        return await retry(lambda: self._view(request), attempts=1 + int(UPDATE_PATIENCE_S / 2),
                           first_delay_s=0.2, max_delay_s=2.0, transient=_busy)

    async def _view(self, request: StreamRequest) -> StreamView:
        """Ask the batch's open run (``open_run``): a run closing as it continues as new refuses
        (``HandedOver``, asked again by ``view``)."""
        return await query_open(self._workflow, TasksetRun.stream_view, request)

    async def stream(self, consumer: str = "trainer", batch_size: int = 1, *,
                     poll_s: float = POLL_S) -> AsyncIterator[StreamBatch]:
        """Yield finished groups ``batch_size`` at a time, in completion order, until the batch
        is done; each batch is delivered again (after a restart) until it is acknowledged. A job
        started with ``max_in_flight`` smaller than ``batch_size`` gives batches of that many
        groups (it starts no more before an ack), and the last batch may be short.

        Raises:
            ConfigError: a bad consumer name or batch size, or a job that does not stream.
        """
        _checked(consumer)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ConfigError(f"batch_size={batch_size!r}: use a whole number from 1 to 1000")
        reader = StreamReader(self, consumer)
        start = await reader.register()
        while True:
            try:  # read ahead: a consumer behind the batch gets several batches per query
                chunk = await reader.read(start, max(batch_size, READ_AHEAD_GROUPS))
            except RPCError:
                if await self._running():
                    raise
                await reader._close()  # closed between two reads: the rest is in storage
                continue
            batches = carve(chunk, min(batch_size, chunk.max_in_flight or batch_size))
            for begin, end in batches:
                records = chunk.groups[begin - chunk.start:end - chunk.start]
                batch = StreamBatch(self, consumer, begin, end, records, reader=reader)
                batch.groups = [await self._runs(g) for g in records]
                start = end
                yield batch
                if chunk.done and start >= chunk.delivered:
                    await reader.flush()  # every pipelined ack recorded
                    return  # the last group: the batch may close once it is acknowledged
            if not batches:
                if chunk.done and not chunk.groups:
                    await reader.flush()
                    return
                await reader.wait(start, min(batch_size, chunk.max_in_flight or batch_size), poll_s)

    async def _runs(self, group: FinishedGroup) -> list[Run]:
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(None, run_from_result, r, None, self.id, self.store)
                for r in group.results]

    async def set_policy(self, version: int, endpoint: str | None = None) -> int:
        """Publish the trainer's policy: new rollouts sample with ``version`` (never backwards)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigError(f"policy version {version!r}: use a whole number >= 0")
        return int(await self._update("set_policy", PolicyRef(version=version, endpoint=endpoint)))

    async def unregister(self, consumer: str) -> int:
        """Stop holding groups for ``consumer``, a registered consumer that will not come back
        soon (a crashed eval, say): groups the others acknowledged then leave the batch's state.
        Its cursor is kept: a ``stream()`` under that name later resumes from it, reading what it
        missed from the stream's pages. Returns the cursor. On a closed job nothing is held, and
        this only returns the stored cursor.

        Raises:
            ConfigError: a bad name, or one not registered with this job.
        """
        try:
            return int(await self._update("stream_unregister", _checked(consumer)))
        except JobClosedError:
            return await StreamReader(self, consumer)._close()

    async def add(self, taskset: Any, agent: Any = None, *, runtime: Any = None, group: int | None = None,
                  epochs: int = 1, seed: int | None = None) -> AddedRows:
        """Give the running job further rows: ``taskset``'s rows (``epochs`` times, each epoch in
        its own order from ``seed``), run ``group`` times each by the job's agent on its runtime,
        after the rows it has, and streamed to its consumers like them. Returns where they went
        (``first``: their first position; ``rollouts``: how many they add). A row added again
        is a new group (its slug gets ``-a<k>`` for the k-th add).

        ``agent``, ``runtime`` and ``group``, when given, must be the job's own.

        Raises:
            ConfigError: bad input, or a job that takes no further rows (closed, failed, or
                ``epochs=None``); JobClosedError: the job has finished.
        """
        from ..sdk.agents import as_agent  # the sdk's, imported when used
        from ..sdk.taskset import register_taskset, taskset_class_path

        if epochs is None:
            raise ConfigError("epochs=None: rows added to a running job run a whole number of epochs")
        check_epochs(epochs, seed)
        seed = order_seed(epochs, seed)
        rows = list(taskset)
        if not rows:
            raise ConfigError(f"taskset {getattr(taskset, 'name', '?')!r} has no rows")
        register_taskset(taskset)  # an in-process worker resolves its rows with the live object
        request = AddRows(
            id=uuid.uuid4().hex, positions=len(rows) * epochs, group=group,
            rows_ref=await asyncio.to_thread(_put_pages, rows, epochs, seed),
            agent=as_agent(agent).spec() if agent is not None else None,
            provider=runtime.spec() if runtime is not None else None,
            taskset_class=taskset_class_path(taskset))
        added = AddedRows.model_validate(await self._update("stream_add", request))
        self.handle.rows_ref = added.rows_ref  # wait() maps every position to its row
        return added

    async def close(self) -> None:
        """Let the batch finish once its rollouts are done, even if consumers lag."""
        await self._update("stream_close", None)

    async def wait(self) -> Job:
        """Wait for the batch to finish (after its consumers caught up) and collect its runs."""
        job = await self.handle.wait()
        self.runs = job.runs
        return self

    async def cancel(self) -> None:
        await self.handle.cancel()

    async def release(self) -> None:
        """Give back the in-process worker (the batch then needs another worker)."""
        await self.handle.release()


def stream_options(max_in_flight: int | None, max_staleness: int | None, on_stale: str,
                   linger_s: float, consumers: list[str] | tuple[str, ...] = (),
                   page_size: int | None = None) -> StreamOptions:
    """Validated stream options (ConfigError for bad input); ``page_size`` None: the
    ``ROLLOUTS_STREAM_PAGE_SIZE`` setting."""
    if page_size is None:
        page_size = settings().stream_page_size
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ConfigError(f"page_size={page_size!r}: use a whole number of groups >= 1")
    if max_in_flight is not None and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int)
                                      or max_in_flight < 1):
        raise ConfigError(f"max_in_flight={max_in_flight!r}: use a whole number >= 1 (or None)")
    if max_staleness is not None and (isinstance(max_staleness, bool)
                                      or not isinstance(max_staleness, int) or max_staleness < 0):
        raise ConfigError(f"max_staleness={max_staleness!r}: use a whole number >= 0 (or None)")
    if on_stale not in ("resample", "drop"):
        raise ConfigError(f"on_stale={on_stale!r}: use resample or drop")
    if not linger_s > 0:
        raise ConfigError(f"linger_s={linger_s!r}: use a number of seconds > 0")
    for name in consumers:
        _checked(name)
    return StreamOptions(max_in_flight=max_in_flight, max_staleness=max_staleness, on_stale=on_stale,
                         linger_s=linger_s, consumers=list(dict.fromkeys(consumers)),  # type: ignore[arg-type]
                         page_size=page_size)


async def start_live(taskset: Any, agent: Any, *, runtime: Any, max_in_flight: int | None = None,
                     max_staleness: int | None = None, on_stale: str = "resample",
                     linger_s: float = 3600.0, policy_version: int | None = None,
                     policy_endpoint: str | None = None, temporal: Any = None,
                     consumers: list[str] | tuple[str, ...] = ("trainer",), page_size: int | None = None,
                     **kwargs: Any) -> LiveJob:
    """Start a streamed batch and return its LiveJob at once (``Taskset.start``).

    ``consumers`` are registered from the start: the finished batch stays open (up to
    ``linger_s`` after a consumer last acted) until each has acknowledged every group.
    ``page_size``: groups every consumer acknowledged leave the workflow in pages of this many
    (default ``ROLLOUTS_STREAM_PAGE_SIZE``)."""
    options = stream_options(max_in_flight, max_staleness, on_stale, linger_s, consumers, page_size)
    policy = None
    if policy_version is not None:
        if isinstance(policy_version, bool) or not isinstance(policy_version, int) or policy_version < 0:
            raise ConfigError(f"policy_version={policy_version!r}: use a whole number >= 0")
        policy = PolicyRef(version=policy_version, endpoint=policy_endpoint)
    client, _ = await _client(temporal)
    handle = await start_job(taskset, agent, runtime=runtime, temporal=client if temporal is not None
                             else None, stream=options, policy=policy, **kwargs)
    return LiveJob(handle, client)


async def attach(job_id: str, *, temporal: Any = None, worker: bool | None = None,
                 task_queue: str | None = None, batch_index: int = 0) -> LiveJob:
    """The LiveJob of a running (or finished) streamed job, e.g. after a trainer restart.

    ``worker``: run an in-process worker for it (default: only with the embedded dev server).
    """
    from .jobs import describe, read_input

    client, embedded = await _client(temporal)
    desc = await describe(client, workflow_id(job_id, batch_index))
    if desc is None:
        raise ConfigError(f"no job {job_id!r} on this Temporal server")
    inp = await read_input(client, desc.id, desc.run_id, TasksetRunInput)
    if inp.stream is None:
        raise ConfigError(f"job {job_id} does not stream finished groups: start it with "
                          "Taskset.start(...) or `rollouts run --detach --stream`")
    job = Job(id=job_id, name=inp.job_name or job_id, group=inp.group, taskset=inp.taskset_name)
    job.batches = batch_index + 1
    workflow = client.get_workflow_handle(desc.id, result_type=TasksetRunResult)
    handle = JobHandle(job=job, batch_index=batch_index, handle=workflow, rows=list(inp.rows),
                       rows_ref=inp.rows_ref)
    queue = task_queue or inp.task_queue
    if worker if worker is not None else embedded:
        handle.relet = lambda: _ensure_worker(client, queue, inp.max_concurrent)
        handle.lease = await handle.relet()
    return LiveJob(handle, client)

