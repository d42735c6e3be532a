"""An in-process progress board: live batch counters without asking Temporal or the workflow.

A worker built by ``durable_rollouts.worker`` posts here when a ``Rollout`` child starts and when
it returns its result (a workflow interceptor; posting emits no command, so replays are
unaffected, and a replay posts nothing). A result posted twice by a retried task counts once, by
the rollout id, among the newest ``RECENT_FINISHED``, so a batch's entry stays small however long
the job runs. A follower in the same process (``rollouts run`` with its embedded worker) reads
the counters for free instead of querying the batch workflow. It only sees rollouts this process
ran: followers must treat it as a lower bound and still ask the workflow now and then. Pure
Python, no temporalio.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["BOARD", "BatchCounts", "ProgressBoard", "Snapshot"]

STATUSES = ("succeeded", "failed", "errored", "timeout", "cancelled")
MAX_BATCHES = 64  # batches whose parent runs elsewhere are never closed here: keep the newest only
# finished rollout ids a batch remembers, to count a result posted twice (a workflow task retried)
# once: the newest only, so a job of 1,000,000 rollouts holds as little as one of 1,000 (all ids
# were 13 MiB per 100,000). Replays of long-finished rollouts do not post (the worker's interceptor).
RECENT_FINISHED = 4096


@dataclass(frozen=True)
class Snapshot:
    """Counters of one batch as this process saw them."""

    running: int
    counts: dict[str, int]
    reward_sum: float
    graded: int

    @property
    def finished(self) -> int:
        return sum(self.counts.values())


@dataclass
class BatchCounts:
    """What this process saw of one batch (the ``TasksetRun`` workflow id)."""

    started: set[str] = field(default_factory=set)  # running: each leaves when its result arrives
    finished: OrderedDict[str, None] = field(default_factory=OrderedDict)  # the newest RECENT_FINISHED
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    running: int = 0
    reward_sum: float = 0.0
    graded: int = 0


class ProgressBoard:
    """Counters per batch, posted by in-process workers; ``workers`` counts the running ones."""

    def __init__(self) -> None:
        self._batches: OrderedDict[str, BatchCounts] = OrderedDict()
        self._lock = threading.Lock()
        self.workers = 0

    def _entry(self, batch: str) -> BatchCounts:
        entry = self._batches.get(batch)
        if entry is None:
            entry = self._batches[batch] = BatchCounts()
            while len(self._batches) > MAX_BATCHES:
                self._batches.popitem(last=False)
        else:
            self._batches.move_to_end(batch)
        return entry

    def started(self, batch: str, rollout_id: str) -> None:
        with self._lock:
            entry = self._entry(batch)
            if rollout_id not in entry.started and rollout_id not in entry.finished:
                entry.started.add(rollout_id)
                entry.running += 1

    def finished(self, batch: str, rollout_id: str, status: str, reward: float | None) -> None:
        with self._lock:
            entry = self._entry(batch)
            if rollout_id in entry.finished or status not in entry.counts:
                return
            if rollout_id in entry.started:
                entry.started.discard(rollout_id)
                entry.running -= 1
            entry.finished[rollout_id] = None
            if len(entry.finished) > RECENT_FINISHED:
                entry.finished.popitem(last=False)
            entry.counts[status] += 1
            if reward is not None:
                entry.reward_sum += reward
                entry.graded += 1

    def close(self, batch: str) -> None:
        """The batch workflow returned: forget it."""
        with self._lock:
            self._batches.pop(batch, None)

    def get(self, batch: str) -> Snapshot | None:
        """What this process saw of ``batch`` so far (None: nothing)."""
        with self._lock:
            entry = self._batches.get(batch)
            if entry is None:
                return None
            return Snapshot(running=entry.running, counts=dict(entry.counts),
                            reward_sum=entry.reward_sum, graded=entry.graded)


BOARD = ProgressBoard()
