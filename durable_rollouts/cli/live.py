"""Where the live progress of a followed batch comes from, nearly for free.

With a worker in this process (``rollouts run`` on the embedded server), the counters come from
the in-process board (``sdk.board``) that the worker updates as Rollout children start and
finish: reading it touches neither Temporal nor the worker. The ``progress`` query is still asked,
but rarely (every ``QUERY_WITH_BOARD_S``), because other workers may run some of the rollouts; the
fresher of the two wins. Without an in-process worker the query is the only source, asked every
``QUERY_S``. Either way the display redraws at ``RENDER_HZ`` (rich's refresh thread only repaints).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from ..temporal.board import BOARD, ProgressBoard
from ..temporal.parts import batch_progress
from ..workflows.types import Progress

__all__ = ["QUERY_S", "QUERY_WITH_BOARD_S", "RENDER_HZ", "Feed"]

RENDER_HZ = 4
QUERY_S = 1.0
QUERY_WITH_BOARD_S = 5.0


class Feed:
    """The latest ``Progress`` of the batch behind ``handle`` (its workflow id keys the board)."""

    def __init__(self, handle: Any, total: int, board: ProgressBoard = BOARD) -> None:
        self.handle = handle
        self.total = total
        self.board = board
        self._queried: Progress | None = None
        self._next_query = 0.0

    def from_board(self) -> Progress | None:
        snap = self.board.get(self.handle.id)
        if snap is None:
            return None
        return Progress(job_id="", total=self.total, started=snap.running + snap.finished,
                        running=snap.running, reward_sum=snap.reward_sum, graded=snap.graded,
                        **snap.counts)

    async def _query(self) -> Progress | None:
        try:
            return await batch_progress(self.handle, rpc_timeout=timedelta(seconds=2))
        except Exception:  # noqa: BLE001 - no worker yet, or the run just continued-as-new
            return None

    async def read(self) -> Progress | None:
        """The board's counters, or the last query's when it has seen more; queries when due."""
        now = time.monotonic()
        local = self.from_board() if self.board.workers else None
        if now >= self._next_query:
            self._next_query = now + (QUERY_WITH_BOARD_S if self.board.workers else QUERY_S)
            queried = await self._query()
            self._queried = queried or self._queried
        if local is None:
            return self._queried
        if self._queried is not None and self._queried.finished > local.finished:
            return self._queried
        return local
