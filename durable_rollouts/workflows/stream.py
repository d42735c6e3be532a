"""A batch's stream of finished groups: what ``TasksetRun`` keeps so trainers consume it exactly once.

A group is finished when every member rollout has its final result (after the batch's
retries). Finished groups are judged once, in completion order: under ``on_error`` (``keep``,
``drop_sample``: the failed members leave the group, ``drop_group``: the whole group leaves)
and ``max_staleness`` (a group sampled more than that many policy versions behind the current
one is stale: re-sampled, or dropped, per ``on_stale``). What survives is appended to the
delivery list. Each consumer has a durable cursor into that list: it reads from its cursor
(a query), and acknowledges ``[start, end)`` with an update, which moves the cursor; an ack at
or behind the cursor is a no-op, so a retried ack is harmless, and a restarted consumer reads
again from its cursor: every unacknowledged group again, never an acknowledged one.

Pure and deterministic (pydantic models plus plain logic): the workflow calls it, carries
``StreamState`` across continue-as-new, and answers queries and updates from it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from durable_rollouts.models import ERROR_STATUSES, RolloutResult, StrictModel

__all__ = [
    "CONSUMER_NAME",
    "SEALED",
    "AckRequest",
    "FinishedGroup",
    "PolicyRef",
    "StreamOptions",
    "StreamRequest",
    "StreamState",
    "StreamView",
    "WaitRequest",
    "check_batch",
    "check_consumer",
]

SEALED = "the stream of this batch is closing"  # an ack refused with it goes to storage
CONSUMER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
OnStale = Literal["resample", "drop"]


def check_consumer(name: str) -> str:
    """``name`` if it is a valid consumer name, else ValueError saying what is allowed."""
    if not isinstance(name, str) or not CONSUMER_NAME.match(name):
        raise ValueError(f"consumer name {name!r}: use 1-64 letters, digits, '_', '.' or '-', "
                         "starting with a letter or digit")
    return name


class PolicyRef(StrictModel):
    """The policy new rollouts sample with: a version the trainer counts up, and where it is served."""

    version: int = Field(ge=0)
    endpoint: str | None = None


class StreamOptions(StrictModel):
    """How a streamed batch paces itself against its consumers (``Taskset.start``)."""

    max_in_flight: int | None = Field(default=None, ge=1)  # groups running or delivered, unacked
    max_staleness: int | None = Field(default=None, ge=0)  # policy versions a group may lag
    on_stale: OnStale = "resample"
    max_resamples: int = Field(default=3, ge=0)  # per group; then a stale group is dropped
    linger_s: float = Field(default=3600.0, gt=0)  # open after the last rollout, for consumers
    consumers: list[str] = Field(default_factory=list)  # registered from the start
    # Groups per stream page: groups every registered consumer acknowledged leave the workflow
    # state in pages of this many (``stream_paging``); None (earlier releases): kept, never paged.
    page_size: int | None = Field(default=None, ge=1)


class FinishedGroup(StrictModel):
    """One delivered group: its members (the kept ones), the group size it counts as, and why."""

    seq: int  # position in the delivery list
    group_id: str
    row_index: int
    slug: str
    size: int  # kept members: what a trainer normalises advantages over
    dropped_samples: int = 0  # failed members left out under on_error="drop_sample"
    policy_version: int | None = None  # the oldest version a member sampled with
    results: list[RolloutResult] = Field(default_factory=list)


class StreamRequest(StrictModel):
    consumer: str
    start: int = Field(ge=0)  # where to read from (the consumer's cursor, or past it)
    limit: int = Field(default=1, ge=1, le=1000)


class WaitRequest(StrictModel):
    """Wake ``consumer`` once the stream has ``want`` groups from ``start`` on (``stream_wait``)."""

    consumer: str
    start: int = Field(ge=0)
    want: int = Field(default=1, ge=1, le=1000)


class StreamView(StrictModel):
    """What a consumer reads: groups ``[start, start + len(groups))`` and where it stands."""

    consumer: str
    cursor: int  # its durable position: every group before it is acknowledged
    start: int
    groups: list[FinishedGroup] = Field(default_factory=list)
    delivered: int = 0  # groups in the delivery list so far
    done: bool = False  # no more groups will be delivered (the last batch may be short)
    policy: PolicyRef | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    # The job's max_in_flight: more groups than that are never delivered before an ack, so a
    # batch waits for at most that many.
    max_in_flight: int | None = None
    # Groups before ``base`` are no longer in the workflow: read them from the stream's pages
    # (``page_size`` groups each, in storage).
    base: int = 0
    page_size: int | None = None


class AckRequest(StrictModel):
    consumer: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class _Pending(StrictModel):
    """A group still running: its expected size and the final results so far."""

    expected: int
    resample: int = 0
    results: list[RolloutResult] = Field(default_factory=list)


class StreamState(StrictModel):
    """The stream's whole state, carried across continue-as-new."""

    options: StreamOptions = Field(default_factory=StreamOptions)
    on_error: str = "keep"
    delivered: list[FinishedGroup] = Field(default_factory=list)  # from seq ``base`` on
    base: int = 0  # seq of delivered[0]: the groups before it are in pages (``stream_paging``)
    pages: int = 0  # pages written (page n holds groups [n * page_size, (n + 1) * page_size))
    sealed: bool = False  # the batch is closing: it takes no more acks (storage does)
    cursors: dict[str, int] = Field(default_factory=dict)
    # Consumers that unregistered, with their cursors: they hold nothing back, and one that
    # registers again resumes where it stopped (the groups behind it are in pages).
    retired: dict[str, int] = Field(default_factory=dict)
    pending: dict[str, _Pending] = Field(default_factory=dict)  # group id -> running group
    started_groups: int = 0
    # Rollouts of re-sampled groups still to start: (row, group index, resample number).
    slots: list[tuple[int, int, int]] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)  # stale_resampled, stale_dropped, ...
    closed: bool = False

    # -- groups ----------------------------------------------------------------------------

    def group_started(self, group_id: str, expected: int, resample: int = 0) -> None:
        """The first member of a group was started."""
        if group_id not in self.pending:
            self.pending[group_id] = _Pending(expected=expected, resample=resample)
            self.started_groups += 1

    def finish(self, result: RolloutResult, policy: PolicyRef | None) -> bool:
        """Record a member's final result; True when it finished its group (judged against the
        current ``policy``)."""
        group = self.pending.get(result.group_id)
        if group is None:
            return False
        group.results.append(result)
        if len(group.results) < group.expected:
            return False
        del self.pending[result.group_id]
        self._judge(result.group_id, group, policy)
        return True

    def _judge(self, group_id: str, group: _Pending, policy: PolicyRef | None) -> None:
        members = sorted(group.results, key=lambda r: r.group_index)
        failed = [r for r in members if r.status in ERROR_STATUSES or r.status == "cancelled"]
        kept = members
        if failed and self.on_error == "drop_group":
            return self._count("dropped_groups")
        if self.on_error == "drop_sample":
            kept = [r for r in members if r not in failed]
            if not kept:
                return self._count("dropped_groups")
        versions = [r.policy_version for r in members if r.policy_version is not None]
        sampled = min(versions) if versions else None
        if self._stale(sampled, policy):
            opts = self.options
            if opts.on_stale == "resample" and group.resample < opts.max_resamples:
                self.slots.extend((r.row_index, r.group_index, group.resample + 1) for r in members)
                return self._count("stale_resampled")
            return self._count("stale_dropped")
        self.delivered.append(FinishedGroup(
            seq=self.total(), group_id=group_id, row_index=members[0].row_index,
            slug=members[0].slug, size=len(kept), dropped_samples=len(members) - len(kept),
            policy_version=sampled, results=kept))

    def _stale(self, sampled: int | None, policy: PolicyRef | None) -> bool:
        limit = self.options.max_staleness
        if limit is None or sampled is None or policy is None:
            return False
        return policy.version - sampled > limit

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def total(self) -> int:
        """Groups delivered so far (paged or kept)."""
        return self.base + len(self.delivered)

    # -- pages -----------------------------------------------------------------------------

    def next_page(self, final: bool = False) -> list[FinishedGroup] | None:
        """The groups of the next page to write, or None: a full page every registered consumer
        has acknowledged (with ``final``: every kept group, a last page maybe short)."""
        size = self.options.page_size
        if size is None or not self.delivered:
            return None
        if final:
            return self.delivered[:size]
        floor = min(self.cursors.values(), default=self.total())
        if floor - self.base < size or len(self.delivered) < size:
            return None
        return self.delivered[:size]

    def paged(self, count: int) -> None:
        """The next page (its first ``count`` kept groups) is in storage: drop them."""
        del self.delivered[:count]
        self.base += count
        self.pages += 1

    # -- pacing ----------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Groups running, plus delivered groups the furthest consumer has not acknowledged."""
        furthest = max(self.cursors.values(), default=0)
        return len(self.pending) + self.total() - furthest

    def may_start_group(self) -> bool:
        limit = self.options.max_in_flight
        return limit is None or self.in_flight() < limit

    def caught_up(self) -> bool:
        """Every registered consumer has acknowledged every delivered group (and there is one)."""
        return bool(self.cursors) and all(c >= self.total() for c in self.cursors.values())

    # -- consumers -------------------------------------------------------------------------

    def register(self, consumer: str) -> int:
        check_consumer(consumer)
        if consumer not in self.cursors:
            self.cursors[consumer] = self.retired.pop(consumer, 0)
        return self.cursors[consumer]

    def check_unregister(self, consumer: str) -> None:
        """ValueError unless ``consumer`` is registered and the batch still takes updates."""
        check_consumer(consumer)
        self.check_open()
        if consumer not in self.cursors:
            raise ValueError(f"consumer {consumer!r} is not registered with this job")

    def unregister(self, consumer: str) -> int:
        """Stop holding groups for ``consumer``; returns its cursor, kept for a later return."""
        self.retired[consumer] = self.cursors.pop(consumer)
        return self.retired[consumer]

    def all_cursors(self) -> dict[str, int]:
        """Every consumer's cursor, registered or retired (what the closed job's manifest keeps)."""
        return {**self.retired, **self.cursors}

    def view(self, req: StreamRequest, done: bool, policy: PolicyRef | None) -> StreamView:
        cursor = self.cursors.get(req.consumer, 0)
        start = max(req.start, cursor)
        kept = max(start - self.base, 0)
        groups = self.delivered[kept:kept + req.limit] if start >= self.base else []
        return StreamView(consumer=req.consumer, cursor=cursor, start=start, groups=groups,
                          delivered=self.total(), done=done, policy=policy, counts=dict(self.counts),
                          max_in_flight=self.options.max_in_flight, base=self.base,
                          page_size=self.options.page_size)

    def check_ack(self, req: AckRequest) -> None:
        """ValueError unless ``req`` acknowledges the consumer's next groups (or is a repeat)."""
        check_consumer(req.consumer)
        self.check_open()
        cursor = self.cursors.get(req.consumer)
        if cursor is None:
            raise ValueError(f"consumer {req.consumer!r} is not registered with this job")
        if req.end <= cursor:
            return  # acknowledged already (a retried ack)
        check_batch(req, cursor, self.total())

    def check_open(self) -> None:
        """ValueError (``SEALED``) once the batch is closing: acks then go to storage."""
        if self.sealed:
            raise ValueError(f"{SEALED}: acknowledgements are kept in storage from now on")

    def ack(self, req: AckRequest) -> int:
        self.cursors[req.consumer] = max(self.cursors[req.consumer], req.end)
        return self.cursors[req.consumer]


def check_batch(req: AckRequest, cursor: int, delivered: int) -> None:
    """ValueError unless ``[req.start, req.end)`` are the next groups after ``cursor`` (the same
    rule for the workflow and, once it has closed, for the cursors in storage)."""
    if req.end <= cursor:
        return  # acknowledged already (a retried ack)
    if req.start != cursor or req.end > delivered or req.end <= req.start:
        raise ValueError(
            f"unknown batch {req.start}-{req.end} for consumer {req.consumer!r}: its next "
            f"unacknowledged group is {cursor} of {delivered} delivered")
