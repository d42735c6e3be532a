"""``rollouts stream``: a streamed job's finished groups as JSON lines, each batch acknowledged
only once its lines are written.

A batch's lines go to stdout (flushed) or are appended to a file (flushed and fsynced) before
``batch.ack()`` records the acknowledgement in the job's workflow, so what is acknowledged has
been written. A consumer stopped in between (a kill, a closed pipe) gets the batch again next
time: stdout may then repeat lines; a file does not, because the groups already in it (same job)
are acknowledged without being written again, and a line cut short by a kill is cut off first.
SIGINT/SIGTERM stop the command after the batch in hand is acknowledged.

Imports the Temporal layer's live-job API lazily (``temporal.live``), never temporalio.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import ConfigError, DurableRolloutsError
from ..ids import workflow_id
from ..sdk.run import Run
from ..workflows.stream import FinishedGroup, check_consumer
from .service import stop_event

__all__ = ["INTERRUPTED", "FileSink", "StdoutSink", "StreamArgs", "close_stream", "group_line",
           "stream_job", "unregister_consumer"]

INTERRUPTED = 130  # exit code after SIGINT/SIGTERM


@dataclass
class StreamArgs:
    job: str
    consumer: str | None = None
    batch_size: int = 1
    output: str = "-"
    traces: bool = False
    temporal: str | None = None
    worker: bool | None = None
    connect_timeout: float = 5.0


class OutputBroken(DurableRolloutsError):
    """The output stopped taking lines (a closed pipe): the batch in hand was not acknowledged."""


def group_line(job_id: str, batch_id: str, record: FinishedGroup, runs: list[Run],
               traces: bool) -> dict[str, Any]:
    """One group as a JSON-ready line: the stream's record and, per kept member, its outcome."""
    members = []
    for run in runs:
        member: dict[str, Any] = {
            "rollout_id": run.rollout_id, "group_index": run.group_index, "status": run.status,
            "reward": run.reward, "policy_version": run.policy_version, "error": run.error,
            "answer": run.trace.content,
        }
        if traces:
            member["trace"] = run.trace.model_dump(mode="json")
        members.append(member)
    return {"job_id": job_id, "batch": batch_id, "seq": record.seq, "group_id": record.group_id,
            "row": record.row_index, "slug": record.slug, "size": record.size,
            "dropped_samples": record.dropped_samples, "policy_version": record.policy_version,
            "rollouts": members}


class StdoutSink:
    """Lines to stdout, flushed before the batch is acknowledged."""

    where = "stdout"

    def write(self, lines: list[tuple[str, str]]) -> int:
        """Write ``(group id, line)`` pairs; returns how many were written."""
        try:
            sys.stdout.write("".join(line for _, line in lines))
            sys.stdout.flush()
        except BrokenPipeError:
            # Nothing more can reach the reader; later flushes (at exit) must not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise OutputBroken("stdout was closed by its reader") from None
        return len(lines)

    def close(self) -> None:
        pass


class FileSink:
    """Lines appended to a file, flushed and fsynced before the batch is acknowledged.

    Groups of ``job_id`` already in the file (an earlier run wrote them, then stopped before it
    acknowledged them) are not written again. A FIFO or device is written to as it is (no read,
    no fsync)."""

    def __init__(self, path: Path, job_id: str) -> None:
        self.where = str(path)
        self.seen: set[str] = set()
        mode = path.stat().st_mode if path.exists() else stat.S_IFREG
        self.regular = stat.S_ISREG(mode)
        if self.regular and path.exists():
            self.seen = _groups_in(path, job_id)
        self.fh = path.open("a", encoding="utf-8")

    def write(self, lines: list[tuple[str, str]]) -> int:
        new = [(gid, line) for gid, line in lines if gid not in self.seen]
        self.fh.write("".join(line for _, line in new))
        self.fh.flush()
        if self.regular:
            os.fsync(self.fh.fileno())
        self.seen.update(gid for gid, _ in new)
        return len(new)

    def close(self) -> None:
        self.fh.close()


def _groups_in(path: Path, job_id: str) -> set[str]:
    """Group ids of ``job_id`` in an earlier output file; a last line cut short is cut off."""
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data):  # killed while writing: that batch was never acknowledged
        with path.open("r+b") as fh:
            fh.truncate(len(complete))
    seen = set()
    for number, raw in enumerate(complete.splitlines(), 1):
        try:
            line = json.loads(raw)
            gid, jid = line["group_id"], line["job_id"]
        except (ValueError, TypeError, KeyError):
            raise ConfigError(f"-o {path}: line {number} is not a `rollouts stream` line; "
                              "append to a stream output file or a new one") from None
        if jid == job_id:
            seen.add(str(gid))
    return seen


def _consumer_name(args: StreamArgs, missing: str) -> str:
    """``--consumer``, checked (``missing``: the error when it was not given)."""
    if args.consumer is None:
        raise ConfigError(missing)
    try:
        return check_consumer(args.consumer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check(args: StreamArgs) -> str:
    """The consumer name; it and ``-o`` are checked before anything connects."""
    name = _consumer_name(args, "--consumer NAME is required: acknowledgements are recorded under it")
    if args.output != "-":
        path = Path(args.output)
        if not path.parent.exists():
            raise ConfigError(f"-o {args.output}: folder {path.parent} does not exist")
        if path.is_dir():
            raise ConfigError(f"-o {args.output} is a folder: name a file")
    return name


async def _attach(args: StreamArgs, *, for_reading: bool) -> Any:
    """The LiveJob of ``args.job`` (``job-<id>`` works too). A job that has closed without
    leaving its stream in storage (an earlier release's) gets an in-process worker when reading
    (unless ``--no-worker``): only a worker answers its queries."""
    from durable_rollouts.temporal.jobs import connect, describe, workflow_ids
    from durable_rollouts.temporal.live import attach
    from durable_rollouts.temporal.stream_pages import StreamStore

    client = await connect(args.temporal, args.connect_timeout)
    for job_id in workflow_ids(args.job):
        desc = await describe(client, workflow_id(job_id))
        if desc is None:
            continue
        worker = args.worker
        if worker is None:
            worker = (for_reading and desc.close_time is not None
                      and await StreamStore(job_id).manifest() is None)
        return await attach(job_id, temporal=client, worker=worker)
    raise ConfigError(f"no job with id {args.job!r} (list recent jobs with `rollouts jobs`)")


async def close_stream(args: StreamArgs, out: Console) -> int:
    """``--close``: the job finishes once its rollouts are done, whoever has not caught up."""
    from durable_rollouts.temporal.live import JobClosedError

    if args.consumer is not None:
        raise ConfigError("--close does not read the stream: leave out --consumer")
    job = await _attach(args, for_reading=False)
    try:
        await job.close()
    except JobClosedError:
        out.print(f"job {job.id} has already closed", highlight=False)
        return 0
    out.print(f"job {job.id}: stream closed; the job finishes once its rollouts are done",
              highlight=False)
    return 0


async def add_rows(args: StreamArgs, tasks: str, epochs: int, seed: int | None, out: Console) -> int:
    """``rollouts add``: the rows of ``tasks`` join the running job (``LiveJob.add``)."""
    from durable_rollouts.cli.specs import add_cwd_to_path, load_tasks
    from durable_rollouts.stores.row_pages import check_epochs
    from durable_rollouts.temporal.live import JobClosedError

    check_epochs(epochs, seed)
    add_cwd_to_path()
    taskset = load_tasks(tasks)  # before connecting: a bad file changes nothing
    job = await _attach(args, for_reading=False)
    try:
        added = await job.add(taskset, epochs=epochs, seed=seed)
    except JobClosedError as exc:
        raise ConfigError(f"job {job.id} has closed: it takes no further rows ({exc})") from None
    out.print(f"job {job.id}: {added.rollouts} rollouts added ({added.positions} rows from position "
              f"{added.first}); its stream delivers them after the groups it has", highlight=False,
              soft_wrap=True)
    return 0


async def unregister_consumer(args: StreamArgs, out: Console) -> int:
    """``--unregister``: the job stops holding groups for ``--consumer`` (its cursor is kept)."""
    name = _consumer_name(args, "--unregister needs --consumer NAME: the consumer to stop holding groups for")
    job = await _attach(args, for_reading=False)
    cursor = await job.unregister(name)
    out.print(f"job {job.id}: consumer {name} unregistered, its cursor at group {cursor}; "
              f"the job holds no groups for it (streaming as {name} again resumes there)",
              highlight=False, soft_wrap=True)
    return 0


async def stream_job(args: StreamArgs, err: Console) -> int:
    """Print the job's finished groups, acknowledging each batch once written; the exit code."""
    consumer = _check(args)
    job = await _attach(args, for_reading=True)
    sink = StdoutSink() if args.output == "-" else FileSink(Path(args.output), job.id)
    stop = stop_event()
    groups = written = 0
    try:
        stream = job.stream(consumer=consumer, batch_size=args.batch_size)
        async with contextlib.aclosing(_until(stream, stop)) as batches:
            async for batch in batches:
                lines = [(record.group_id, json.dumps(group_line(job.id, batch.id, record, runs,
                                                                 args.traces)) + "\n")
                         for record, runs in zip(batch.records, batch.groups, strict=True)]
                try:
                    written += sink.write(lines)
                except OutputBroken as exc:
                    raise OutputBroken(f"{exc}: batch {batch.id} was not acknowledged; consumer "
                                       f"{consumer!r} gets it again next time") from None
                await batch.ack()
                groups += len(lines)
    finally:
        sink.close()
        await job.release()
    skipped = f", {groups - written} already in {sink.where}" if written < groups else ""
    if stop.is_set():
        err.print(f"stopped: consumer {consumer!r} acknowledged {groups} group(s){skipped}; "
                  "the rest is delivered to it next time", highlight=False, soft_wrap=True)
        return INTERRUPTED
    err.print(f"job {job.id}: stream ended; consumer {consumer!r} acknowledged {groups} "
              f"group(s){skipped}", highlight=False, soft_wrap=True)
    return 0


async def _until(stream: AsyncIterator[Any], stop: asyncio.Event) -> AsyncIterator[Any]:
    """``stream``'s items until it ends or ``stop`` is set (a wait for the next item is cut
    short; an item already received is still yielded, so it can be handled to the end)."""
    halt = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            nxt = asyncio.ensure_future(anext(stream, None))
            await asyncio.wait({nxt, halt}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await nxt
                return
            item = nxt.result()
            if item is None:
                return
            yield item
    finally:
        halt.cancel()
        await stream.aclose()  # type: ignore[attr-defined]
