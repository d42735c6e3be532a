"""The in-process progress board (``sdk.board``): what the live bar of `rollouts run` reads."""

from __future__ import annotations

from durable_rollouts.temporal.board import MAX_BATCHES, RECENT_FINISHED, ProgressBoard


def test_replayed_posts_count_once_and_running_is_started_minus_finished() -> None:
    """A replayed workflow posts its start and result again: each rollout id counts once, and
    running drops as results arrive (a result without a seen start does not go negative)."""
    board = ProgressBoard()
    for rid in ("r0", "r1", "r2", "r0"):  # r0's start posted twice (a replay after eviction)
        board.started("job-a", rid)
    board.finished("job-a", "r0", "succeeded", 1.0)
    board.finished("job-a", "r0", "succeeded", 1.0)  # the replayed result
    board.finished("job-a", "r1", "errored", None)
    board.finished("job-a", "late", "failed", 0.0)  # its start ran in another process
    snap = board.get("job-a")
    assert snap is not None
    assert snap.running == 1 and snap.finished == 3
    assert (snap.counts["succeeded"], snap.counts["errored"], snap.counts["failed"]) == (1, 1, 1)
    assert (snap.reward_sum, snap.graded) == (1.0, 2)
    board.started("job-a", "r1")  # a replayed start after its result: still finished, not running
    assert board.get("job-a").running == 1  # type: ignore[union-attr]


def test_closed_batches_are_forgotten_and_only_the_newest_batches_are_kept() -> None:
    """A returned batch is dropped at once; batches whose parent runs elsewhere never close, so
    the board keeps only the MAX_BATCHES most recently updated ones."""
    board = ProgressBoard()
    board.started("done", "r")
    board.close("done")
    assert board.get("done") is None
    for i in range(MAX_BATCHES + 5):
        board.started(f"job-{i}", "r")
    board.started("job-0", "r2")  # touched again: among the newest
    assert board.get("job-0") is not None
    assert board.get("job-1") is None and board.get(f"job-{MAX_BATCHES + 4}") is not None


def test_a_batch_remembers_only_its_newest_finished_ids() -> None:
    """A job of any length holds at most RECENT_FINISHED ids per batch (all of them were 13 MiB
    per 100,000 rollouts in a worker): the counts still take every result, a result posted twice
    within the window counts once, and no running rollout is forgotten."""
    board = ProgressBoard()
    n = 3 * RECENT_FINISHED
    for i in range(n):
        board.started("long", f"r{i}")
        board.finished("long", f"r{i}", "succeeded", 1.0)
    board.started("long", "still-running")
    board.finished("long", f"r{n - 1}", "succeeded", 1.0)  # a retried task posts it again
    snap = board.get("long")
    assert snap is not None and snap.finished == n and snap.running == 1 and snap.graded == n
    entry = board._batches["long"]
    assert len(entry.finished) == RECENT_FINISHED and entry.started == {"still-running"}
