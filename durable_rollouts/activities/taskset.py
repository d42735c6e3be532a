"""Activities of the ``TasksetRun`` workflow: resolve a group's task, flush results to a store.

``resolve_group`` calls ``Taskset.resolve_task`` on the worker: the live taskset object when the
caller registered it in this process (the embedded worker), else an instance of its class built
from the import path. ``store_results`` writes a chunk of compact results as JSONL (a claim check,
through the ``ROLLOUTS_STORAGE`` driver) so continue-as-new carries references, not thousands of
results; ``load_rows`` reads a window of a large taskset's rows the same way, and ``extend_rows``
chains rows added to a running streamed batch after the ones it had.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from durable_rollouts.activities.failures import map_errors
from durable_rollouts.models import ResultsRef, Task
from durable_rollouts.sdk.taskset import load_taskset
from durable_rollouts.stores.results import ResultStore
from durable_rollouts.workflows.types import (
    ACT_EXTEND_ROWS,
    ACT_LOAD_ROWS,
    ACT_RESOLVE,
    ACT_STORE_RESULTS,
    ExtendRowsInput,
    LoadRowsInput,
    ResolveGroupInput,
    StoreResultsInput,
)

__all__ = ["TasksetActivities"]

class TasksetActivities:
    def __init__(self, results: ResultStore | None = None) -> None:
        self.results = results or ResultStore()

    def all(self) -> list[Any]:
        return [self.resolve_group, self.store_results, self.load_rows, self.extend_rows]

    @activity.defn(name=ACT_RESOLVE)
    async def resolve_group(self, inp: ResolveGroupInput) -> Task:
        with map_errors():
            if inp.taskset_class is None:
                return inp.task
            taskset = load_taskset(inp.taskset_class, inp.taskset_name)
            return await taskset.aresolve(inp.task)

    @activity.defn(name=ACT_LOAD_ROWS)
    async def load_rows(self, inp: LoadRowsInput) -> list[Task]:
        return await asyncio.to_thread(self.results.get_rows, inp.uri, inp.start, inp.stop)

    @activity.defn(name=ACT_EXTEND_ROWS)
    async def extend_rows(self, inp: ExtendRowsInput) -> str:
        """The uri of the chain: the batch's rows so far, then the added ones."""
        return await asyncio.to_thread(self.results.extend_rows, inp.base_ref, inp.base_rows,
                                       inp.base_total, inp.added_ref, inp.added_total)

    @activity.defn(name=ACT_STORE_RESULTS)
    async def store_results(self, inp: StoreResultsInput) -> ResultsRef:
        return await asyncio.to_thread(self.results.put, inp.job_id, inp.batch_index, inp.chunk,
                                       inp.results)
