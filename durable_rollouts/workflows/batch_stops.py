"""How rollouts of a batch end without running to their own end: a group whose task did not
resolve, ``on_error="fail"`` stopping the rest, and a cancelled batch.

A mixin of ``TasksetRun``. Deterministic: stdlib, temporalio and the workflow models only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import group_id, rollout_id
    from durable_rollouts.models import RolloutResult, Task
    from durable_rollouts.workflows.types import Progress, TasksetRunInput

__all__ = ["BatchStops"]


class BatchStops:
    """Results for rollouts that did not run to their end (the workflow sets the fields)."""

    _progress: Progress | None
    _failed_on: str | None
    _next_slot: Callable[[TasksetRunInput, int, int], tuple[int, int, int] | None]
    _group_started: Callable[[TasksetRunInput, tuple[int, int, int]], None]
    _count: Callable[[TasksetRunInput, RolloutResult], None]
    _consume: Callable[[tuple[int, int, int], int], int]
    _stop_carried: Callable[[], Awaitable[None]]
    _set_status: Callable[[TasksetRunInput, str], None]
    _slot: Callable[[TasksetRunInput, int], tuple[int, int]]
    _row: Callable[[TasksetRunInput, int], Awaitable[Task]]

    def _group_unresolved(self, inp: TasksetRunInput, row: Task, slot: tuple[int, int, int], index: int,
                          total: int, err: ActivityError, results: list[RolloutResult]) -> int:
        """Record every rollout of a group whose task did not resolve as failed; the next index."""
        assert self._progress is not None
        row_index, _, resample = slot
        while (nxt := self._next_slot(inp, index, total)) is not None and nxt[0] == row_index \
                and nxt[2] == resample:
            failed = self._unresolved(inp, row, row_index, nxt[1], err, resample)
            results.append(failed)
            self._progress.started += 1
            self._group_started(inp, nxt)
            self._count(inp, failed)
            index = self._consume(nxt, index)
        return index

    async def _fail_rest(self, inp: TasksetRunInput, pending: list[asyncio.Task[RolloutResult]],
                         index: int, total: int, results: list[RolloutResult]) -> int:
        """Cancel every running rollout (each one still tears down) and record the unstarted ones
        as cancelled; returns ``total`` (nothing is left to start)."""
        progress = self._progress
        assert progress is not None
        for fut in pending:
            fut.cancel()
        await self._stop_carried()
        cut = f"on_error=fail stopped the batch after {self._failed_on} failed"
        for outcome in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(outcome, RolloutResult):
                if outcome.status == "cancelled" and cut not in (outcome.error or ""):
                    outcome.error = f"cancelled: {cut}" + (f" ({outcome.error})" if outcome.error else "")
                results.append(outcome)
                progress.running -= 1
                progress.count(outcome)
        note = f"not started: {cut}"
        while index < total:
            row_index, group_index = self._slot(inp, index)
            row = await self._row(inp, row_index)
            skipped = RolloutResult(
                rollout_id=rollout_id(inp.job_id, row.slug, group_index, inp.batch_index), slug=row.slug,
                group_id=group_id(inp.job_id, row_index, inp.batch_index), group_index=group_index,
                row_index=row_index, status="cancelled", attempts=0, error=note)
            results.append(skipped)
            progress.started += 1
            progress.count(skipped)
            index += 1
        return index

    async def _cancel_children(self, inp: TasksetRunInput, pending: list[asyncio.Task[RolloutResult]]) -> None:
        # Cancel every running Rollout and wait for it, so each one's teardown runs before we close.
        for fut in pending:
            fut.cancel()
        await self._stop_carried()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._progress is not None:
            self._progress.cancelled += self._progress.running
            self._progress.running = 0
        self._set_status(inp, "cancelled")

    def _unresolved(self, inp: TasksetRunInput, row: Task, row_index: int, group_index: int,
                    err: ActivityError, resample: int = 0) -> RolloutResult:
        cause = err.cause or err
        return RolloutResult(
            rollout_id=rollout_id(inp.job_id, row.slug, group_index, inp.batch_index, resample),
            slug=row.slug, group_id=group_id(inp.job_id, row_index, inp.batch_index, resample),
            group_index=group_index,
            row_index=row_index, status="failed", error=f"[resolving] {cause}", error_phase="resolving",
        )
