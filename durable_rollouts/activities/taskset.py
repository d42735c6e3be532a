"""Activities of the ``TasksetRun`` workflow: resolve a group's task, flush results to a store.

``resolve_group`` calls ``Taskset.resolve_task`` on the worker: the live taskset object when the
caller registered it in this process (the embedded worker), else an instance of its class built
from the import path. ``store_results`` writes a chunk of compact results as JSONL (a claim check,
through the ``ROLLOUTS_STORAGE`` driver) so continue-as-new carries references, not thousands of
results; ``load_rows`` reads a window of a large taskset's rows the same way, and ``extend_rows``
chains rows added to a running streamed batch after the ones it had. ``await_rollouts`` waits for
the Rollouts a batch's previous run left running when it continued as new (it waits on their
results through the worker's client: temporalio offers no way for a workflow to await a workflow
it did not start itself).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode

from durable_rollouts.activities.failures import map_errors
from durable_rollouts.models import ResultsRef, RolloutResult, Task
from durable_rollouts.sdk.taskset import load_taskset
from durable_rollouts.stores.results import ResultStore
from durable_rollouts.workflows.types import (
    ACT_AWAIT_ROLLOUTS,
    ACT_EXTEND_ROWS,
    ACT_LOAD_ROWS,
    ACT_RESOLVE,
    ACT_STORE_RESULTS,
    AwaitedRollout,
    AwaitRolloutsInput,
    ExtendRowsInput,
    LoadRowsInput,
    ResolveGroupInput,
    StoreResultsInput,
)

__all__ = ["TasksetActivities"]

BEAT_S = 5.0  # heartbeats of ``await_rollouts`` (its heartbeat timeout is a few of these)
CANCEL_WAIT_S = 300.0  # how long a cancelled ``await_rollouts`` waits for the Rollouts to close

class TasksetActivities:
    def __init__(self, results: ResultStore | None = None) -> None:
        self.results = results or ResultStore()

    def all(self) -> list[Any]:
        return [self.resolve_group, self.store_results, self.load_rows, self.extend_rows,
                self.await_rollouts]

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

    @activity.defn(name=ACT_AWAIT_ROLLOUTS)
    async def await_rollouts(self, inp: AwaitRolloutsInput) -> list[AwaitedRollout]:
        """Wait until one of the Rollouts closes, then ``linger_s`` for others closing with it;
        returns how each closed one ended, in the order they closed. Cancelled (the batch was
        cancelled or stopped): cancel every one still running and wait for each to close (its
        teardown runs) before raising."""
        client = activity.client()
        closed: list[AwaitedRollout] = []
        waits = [asyncio.ensure_future(_ended(client, wid, closed)) for wid in inp.workflow_ids]
        beat = asyncio.ensure_future(_beat())
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if len(closed) < len(waits):
                await asyncio.wait(waits, timeout=inp.linger_s)
            for wait in waits:
                if wait.done() and wait.exception() is not None:
                    raise wait.exception()  # e.g. the server unreachable: retried
            return list(closed)
        except asyncio.CancelledError:
            running = [wid for wid, wait in zip(inp.workflow_ids, waits, strict=True) if not wait.done()]
            await asyncio.gather(*(client.get_workflow_handle(wid).cancel() for wid in running),
                                 return_exceptions=True)
            if running:  # each one's teardown runs before the batch closes
                await asyncio.wait([w for w in waits if not w.done()], timeout=CANCEL_WAIT_S)
            raise
        finally:
            beat.cancel()
            for wait in waits:
                wait.cancel()


async def _ended(client: Client, wid: str, closed: list[AwaitedRollout]) -> None:
    """Append how Rollout ``wid`` ended to ``closed`` once it has closed."""
    handle = client.get_workflow_handle(wid, result_type=RolloutResult)
    try:
        closed.append(AwaitedRollout(workflow_id=wid, result=await handle.result()))
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        closed.append(AwaitedRollout(workflow_id=wid, error=f"Rollout {wid} not found: {err.message}"))
    except WorkflowFailureError as err:
        cause = err.cause
        closed.append(AwaitedRollout(workflow_id=wid, cancelled=isinstance(cause, CancelledError),
                                     error=str(cause or err)))


async def _beat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(BEAT_S)
