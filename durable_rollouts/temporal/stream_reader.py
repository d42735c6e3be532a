"""One consumer's reading of a job's stream, while the batch runs and after it has closed.

While the batch runs, the consumer registers with an update, reads with the ``stream_view``
query, and acknowledges with an update. Having read everything, it waits for more with the
``stream_wait`` update, which the batch completes once the groups are delivered (a long poll;
workers of an earlier release lack it, and the reader then polls). The batch keeps only the
groups some registered consumer has not acknowledged; a consumer behind the oldest kept group
(``view.base``) reads the groups before it from the stream's pages in storage, in the same
order, under the same cursor.

Once the batch has closed (or is closing: it refuses acks with ``SEALED``), the stream is all in
storage: the manifest says how many groups there are and where every consumer stood, and an ack
moves the consumer's cursor stored next to it, by the same rule the workflow applies
(``check_batch``). A batch closed without a manifest (an earlier release, a cancelled batch) is
read with the query (it needs a worker) and its acks are stored the same way.

Acks may be pipelined (``ack(..., wait=False)``): the reader keeps at most one ack in flight and
sends every batch acknowledged meanwhile as one range when it lands, so a consumer that hands
out a batch per group is not held to one update round trip per group. Such an ack is durable
once a later awaited ack, or ``flush``, returns; until then a restarted consumer gets its groups
again (never fewer).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..workflows.stream import AckRequest, FinishedGroup, StreamView, WaitRequest, check_batch
from ..workflows.stream_paging import StreamManifest
from .stream_pages import StreamStore

__all__ = ["Chunk", "JobClosedError", "StreamReader"]

MANIFEST_WAIT_S = 120.0  # how long a closing batch may take to write its manifest
SPURIOUS_PAUSE_S = 0.1  # after a wait the batch ended early (its run continuing as new, say)
HANDOVER_WAITS = 50  # waits in a row a run continuing as new may answer "handing over" (~5 s)


@dataclass
class Chunk:
    """What one read gives: groups from ``start`` on, and whether more can come."""

    start: int
    groups: list[FinishedGroup] = field(default_factory=list)
    done: bool = False  # no more groups will be delivered
    max_in_flight: int | None = None
    delivered: int = 0  # groups delivered so far


class JobClosedError(ConfigError):
    """The job's batch workflow has closed (or is closing): it takes no more acknowledgements
    or policies (a consumer's acknowledgements then go to storage)."""


class StreamReader:
    """``consumer``'s stream of ``job`` (a ``LiveJob``): register, read, ack; open or closed alike."""

    def __init__(self, job: Any, consumer: str) -> None:
        self.job, self.consumer = job, consumer
        self.store = StreamStore(job.id, job.handle.batch_index)
        self.closed = False
        self.manifest: StreamManifest | None = None
        self.cursor = 0  # closed: the consumer's cursor (stored, or as the batch left it)
        self.delivered = 0  # closed: groups in the stream
        self.durable = 0  # the consumer's cursor as last recorded (by the batch, or in storage)
        self.target = 0  # every group before it is acknowledged, recorded or not yet
        self._flight: asyncio.Task[None] | None = None  # the ack being recorded, and those after it
        self._failed: BaseException | None = None  # a pipelined ack that could not be recorded
        self._wakes = True  # the batch takes ``stream_wait`` (workers of an earlier release do not)

    async def register(self) -> int:
        """Register the consumer (the batch keeps its groups for it); returns its cursor."""
        try:
            cursor = int(await self.job._update("stream_register", self.consumer))
        except JobClosedError:
            cursor = await self._close()
        self.durable = self.target = cursor
        return cursor

    async def _close(self) -> int:
        """Switch to the stream in storage (the batch has closed, or is closing)."""
        if self.closed:
            return self.cursor
        deadline = time.monotonic() + MANIFEST_WAIT_S
        while (manifest := await self.store.manifest()) is None:
            if not await self.job._running():  # closed without one: read with the query
                view = await self.job.view(self.consumer, 0, 1)
                self.cursor, self.delivered = view.cursor, view.delivered
                break
            if time.monotonic() > deadline:
                raise ConfigError(f"job {self.job.id} is closing but wrote no stream manifest "
                                  f"within {MANIFEST_WAIT_S:.0f} s")
            await asyncio.sleep(0.2)
        if manifest is not None:
            self.manifest = manifest
            self.cursor = manifest.cursors.get(self.consumer, 0)
            self.delivered = manifest.delivered
        self.cursor = max(self.cursor, await self.store.cursor(self.consumer))
        self.closed = True
        return self.cursor

    async def read(self, start: int, limit: int) -> Chunk:
        """Up to ``limit`` groups from ``start`` (or from the consumer's cursor, if further)."""
        if self.manifest is not None:
            start = max(start, self.cursor)
            m = self.manifest
            groups = await self.store.read(start, limit, m.page_size, m.delivered)
            return Chunk(start, groups, done=True, delivered=m.delivered)
        view = await self.job.view(self.consumer, start, limit)
        start = max(view.start, self.cursor)
        if start >= view.base:
            groups = view.groups if start == view.start else []
            if start != view.start:
                view = await self.job.view(self.consumer, start, limit)
                groups = view.groups
            return self._chunk(start, groups, view)
        assert view.page_size is not None  # groups before base are paged
        paged = await self.store.read(start, limit, view.page_size, view.base)
        if len(paged) < limit and start + len(paged) == view.base:  # the rest from the batch
            rest = await self.job.view(self.consumer, view.base, limit - len(paged))
            return self._chunk(start, paged + rest.groups, rest)
        return self._chunk(start, paged, view)

    async def wait(self, start: int, want: int, poll_s: float) -> None:
        """Return once the stream may hold ``want`` groups from ``start`` on: when the batch says
        they are delivered (or it is done, or its run is leaving), or after ``poll_s`` where it
        cannot say (closed; a worker of an earlier release)."""
        if self.closed or not self._wakes:
            await asyncio.sleep(poll_s)
            return
        request = WaitRequest(consumer=self.consumer, start=start, want=want)
        for _ in range(HANDOVER_WAITS):
            try:
                delivered = int(await self.job._update("stream_wait", request))
            except JobClosedError:
                await self._close()
                return
            except ConfigError as exc:
                if "stream_wait" not in str(exc) or "not found" not in str(exc):
                    raise
                self._wakes = False  # an earlier release's workflow: poll
                return
            if delivered >= 0:
                break
            # the run continues as new with nothing more to read: wait on the next run instead
            # of querying this one as it closes (that query would be answered by a replay)
            await asyncio.sleep(SPURIOUS_PAUSE_S)
        if delivered < start + want:  # woken early: do not spin while a run hands over
            await asyncio.sleep(SPURIOUS_PAUSE_S)

    def _chunk(self, start: int, groups: list[FinishedGroup], view: StreamView) -> Chunk:
        return Chunk(start, groups, done=view.done or self.closed, max_in_flight=view.max_in_flight,
                     delivered=view.delivered)

    async def ack(self, start: int, end: int, wait: bool = True) -> int:
        """Acknowledge ``[start, end)``; returns the consumer's recorded cursor. With ``wait``
        (the default) it returns once the ack is recorded; without, at once (the ack is recorded
        behind the one in flight, with every other ack sent meanwhile, as one range).

        Raises:
            ConfigError: ``[start, end)`` is not the consumer's next groups, or an earlier
                pipelined ack was refused.
        """
        self._raise_failed()
        if end <= self.target:  # acknowledged already (a repeat), or queued behind the flight
            return await self.flush() if wait else self.durable
        if start != self.target:  # the rule the batch applies, against what this consumer sent
            raise ConfigError(f"unknown batch {start}-{end} for consumer {self.consumer!r}: its next "
                              f"unacknowledged group is {self.target}")
        self.target = end
        if self._flight is None or self._flight.done():
            self._flight = asyncio.ensure_future(self._record())
        return await self.flush() if wait else self.durable

    async def flush(self) -> int:
        """Wait until every acknowledgement so far is recorded; returns the recorded cursor."""
        while self._flight is not None and not self._flight.done():
            await asyncio.shield(self._flight)
        self._raise_failed()
        return self.durable

    def _raise_failed(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    async def _record(self) -> None:
        """Record acks until none is left to record (one update each round: all sent since)."""
        try:
            while self.durable < self.target:
                self.durable = await self._ack_once(self.durable, self.target)
                self.target = max(self.target, self.durable)  # another reader of this name went on
        except Exception as exc:  # handed to the consumer's next ack (or flush)
            self._failed = exc
            self.target = self.durable

    async def _ack_once(self, start: int, end: int) -> int:
        """Record ``[start, end)`` in the batch, or in storage once it has closed."""
        req = AckRequest(consumer=self.consumer, start=start, end=end)
        if not self.closed:
            try:
                return int(await self.job._update("stream_ack", req))
            except JobClosedError:
                await self._close()
        try:
            check_batch(req, self.cursor, self.delivered)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.cursor = await self.store.put_cursor(self.consumer, max(self.cursor, end))
        return self.cursor
