"""A batch wider than one workflow may hold: ``TasksetRun`` runs it as parts.

Temporal lets one workflow hold at most 2,000 pending children (and 2,000 pending activities).
A batch whose ``max_concurrent`` (and rollouts left) exceed ``TasksetRunInput.children_per_workflow``
starts ``n = ceil(width / children_per_workflow)`` child TasksetRuns ("parts", workflow ids
``<batch>/part-<k>``), each over a disjoint contiguous slice of the batch's slots, at
``ceil(max_concurrent / n)`` each. A part is an ordinary TasksetRun (same job id, batch index,
rollout ids and RolloutsJobId on every Rollout), so readers that go by rollout ids see one batch.
The batch sums the parts' results and counters; its ``progress`` lists the parts still running
(the client adds their own ``progress``: ``temporal.parts``). Under ``on_error="fail"`` the first
part that fails stops the others (signal ``stop_batch``): they cancel their rest as if it were theirs.
A streamed batch runs as parts too, whole groups each, feeding its one stream (``stream_parts``).

Deterministic: stdlib, temporalio and the workflow models only; the part runs ``TasksetRun`` by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import shard_id
    from durable_rollouts.models import RolloutResult, Task
    from durable_rollouts.workflows.types import (
        Progress,
        ResultsRef,
        TasksetRunInput,
        TasksetRunResult,
    )

__all__ = ["COUNTERS", "FanOut", "add_progress", "part_slices"]

KEY_JOB_ID = SearchAttributeKey.for_keyword("RolloutsJobId")

COUNTERS = ("started", "running", "succeeded", "failed", "errored", "timeout", "cancelled",
            "reward_sum", "graded")


def add_progress(into: Progress, part: Progress) -> None:
    """Add a part's counters to its batch's (not ``total``: the batch counts its own)."""
    for name in COUNTERS:
        setattr(into, name, getattr(into, name) + getattr(part, name))


def part_slices(inp: TasksetRunInput, start: int, total: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) slices of the slots left, one per part; [] when one workflow holds
    the batch. Slices start at a group's first slot when there are at least as many groups."""
    limit = inp.children_per_workflow
    width = min(inp.max_concurrent, total - start)
    if limit is None or inp.part is not None or inp.open_ended or width <= limit:
        return []
    n = -(-width // limit)
    left = total - start
    if inp.stream is not None and (inp.only is not None or left // inp.group < n):
        return []  # a streamed batch's parts hold whole groups (``stream_parts``)
    group = inp.group if inp.only is None and left // inp.group >= n else 1
    units = left // group
    cuts = [start + (k * units // n) * group for k in range(n)] + [total]
    return list(itertools.pairwise(cuts))


class FanOut:
    """The batch side of a batch run as parts (mixed into ``TasksetRun``)."""

    _failed_on: str | None
    _progress: Progress | None
    _resolve: Callable[[TasksetRunInput, Task], Awaitable[Task]]
    _row: Callable[[TasksetRunInput, int], Awaitable[Task]]

    @workflow.signal(name="stop_batch")
    def stop_batch(self, failed_on: str) -> None:
        """A sibling part failed under ``on_error="fail"``: cancel the rest as if it were ours."""
        if self._failed_on is None:
            self._failed_on = failed_on

    @staticmethod
    def _shared_rows(inp: TasksetRunInput, slices: list[tuple[int, int]]) -> list[int]:
        """Rows whose group is split between two parts."""
        if inp.only is not None:
            return [inp.only[cut][0] for cut, _ in slices[1:] if inp.only[cut - 1][0] == inp.only[cut][0]]
        return [cut // inp.group for cut, _ in slices[1:] if cut % inp.group]

    def _part_input(self, inp: TasksetRunInput, k: int, start: int, stop: int, n: int,
                    resolved: dict[int, Task]) -> TasksetRunInput:
        if inp.only is not None:
            slots = inp.only[start:stop]
            rows = {row for row, _ in slots}
            window: dict[str, Any] = {"only": slots, "next_index": 0, "stop_index": None}
        else:
            rows = set(range(start // inp.group, -(-stop // inp.group)))
            window = {"next_index": start, "stop_index": stop}
        return inp.model_copy(update={
            **window, "part": k, "max_concurrent": -(-inp.max_concurrent // n),
            "results": [], "result_refs": [], "progress": None,
            "resolved": {r: t for r, t in resolved.items() if r in rows},
        })

    async def _run_parts(self, inp: TasksetRunInput, slices: list[tuple[int, int]],
                         resolved: dict[int, Task], results: list[RolloutResult],
                         refs: list[ResultsRef]) -> None:
        """Run the parts to the end, adding their results to ``results``/``refs`` and their counters
        to the batch's progress; a cancelled batch cancels them and waits for them first."""
        progress = self._progress
        assert progress is not None
        me = workflow.info().workflow_id
        for row in self._shared_rows(inp, slices):  # a group two parts share resolves once, here
            if row not in resolved and inp.taskset_class is not None:
                with contextlib.suppress(ActivityError):  # unresolved: each part records it failed
                    resolved[row] = await self._resolve(inp, await self._row(inp, row))
        parts: dict[asyncio.Future[TasksetRunResult], str] = {}
        attrs = TypedSearchAttributes([SearchAttributePair(KEY_JOB_ID, inp.job_id)]) \
            if inp.search_attributes else None  # the Web UI lists the parts with their job
        try:
            for k, (start, stop) in enumerate(slices):  # one start (a round trip) at a time
                wid = shard_id(me, k)
                parts[await workflow.start_child_workflow(
                    "TasksetRun", self._part_input(inp, k, start, stop, len(slices), resolved),
                    id=wid, task_queue=inp.task_queue, result_type=TasksetRunResult,
                    parent_close_policy=ParentClosePolicy.REQUEST_CANCEL, search_attributes=attrs,
                    static_summary=f"{inp.job_name}: part {k + 1} of {len(slices)} "
                                   f"({stop - start} rollouts)",
                )] = wid
                progress.parts.append(wid)
            while parts:
                done, _ = await workflow.wait(list(parts), return_when=asyncio.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: parts[f]):
                    progress.parts.remove(parts.pop(fut))
                    part = fut.result()
                    add_progress(progress, part.progress)
                    results.extend(part.results)
                    refs.extend(part.result_refs)
                    if part.failed_on is not None and self._failed_on is None:
                        self._failed_on = part.failed_on
                        for other in parts:  # a part that closed meanwhile has nothing to stop
                            with contextlib.suppress(Exception):
                                await other.signal("stop_batch", part.failed_on)  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            for fut in parts:
                fut.cancel()
            await asyncio.gather(*parts, return_exceptions=True)
            raise
