"""Live progress of a followed batch: the in-process board and the feed the progress bar reads."""

from __future__ import annotations

import asyncio
import time

from temporal_helpers import ENV_FILE

from durable_rollouts.cli.live import QUERY_WITH_BOARD_S, Feed
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import SleepAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.board import BOARD, ProgressBoard


def echoes(n: int) -> Taskset:
    return Taskset("echoes", [Task(env="counting", id="echo", args={"expected": "a", "tag": str(i)}, source=ENV_FILE)
                              for i in range(n)])


class CountingHandle:
    """The real workflow handle, counting the queries asked through it."""

    def __init__(self, handle: object) -> None:
        self._handle = handle
        self.queries = 0

    @property
    def id(self) -> str:
        return self._handle.id  # type: ignore[attr-defined]

    async def query(self, *args: object, **kwargs: object) -> object:
        self.queries += 1
        return await self._handle.query(*args, **kwargs)  # type: ignore[attr-defined]


async def test_board_counts_an_in_process_batch_without_queries_and_forgets_it(client, task_queue) -> None:
    """With the worker in this process, the feed's counters come from the board: running is
    bounded by max_concurrent, finished counts up while the batch runs, at most one query is
    asked per QUERY_WITH_BOARD_S, and the board drops the batch once it has returned."""
    handle = await start_job(echoes(4), SleepAgent(seconds=0.5, answer="a"), runtime=LocalRuntime(ENV_FILE),
                             max_concurrent=2, temporal=client, worker=True, task_queue=task_queue)
    spy = CountingHandle(handle.handle)
    feed = Feed(spy, total=4)
    result = asyncio.ensure_future(handle.handle.result())
    t0 = time.monotonic()
    seen = []
    while not result.done():
        p = await feed.read()
        if p is not None:
            seen.append((p.running, p.finished, p.succeeded))
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - t0
    final = (await result).progress
    assert max(r for r, _, _ in seen) == 2
    assert {f for _, f, _ in seen} >= {0, 2}, seen  # the second pair finished while we watched
    assert all(f == ok for _, f, ok in seen)
    assert final.succeeded == 4 and final.mean_reward == 1.0
    # reads at 20 Hz for the whole batch: the board answered all but one per QUERY_WITH_BOARD_S
    assert spy.queries <= 1 + elapsed // QUERY_WITH_BOARD_S, (spy.queries, elapsed)
    assert len(seen) > 5 * spy.queries
    assert BOARD.get(handle.workflow_id) is None
    # A finished rollout replayed to answer a query posts nothing: the board does not count it
    # again (nor bring back the closed batch) once it has forgotten the rollout's id.
    children = [e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                async for e in handle.handle.fetch_history_events()
                if e.HasField("child_workflow_execution_started_event_attributes")]
    assert len(children) == 4
    for child in children:
        assert await client.get_workflow_handle(child).query("phase") is not None
    assert BOARD.get(handle.workflow_id) is None


async def test_feed_falls_back_to_the_query_when_the_board_saw_less(client, task_queue) -> None:
    """Rollouts run by another process never reach this process's board: the feed then returns
    the workflow's own progress (the query), which has seen them."""
    handle = await start_job(echoes(3), SleepAgent(seconds=0.0, answer="a"), runtime=LocalRuntime(ENV_FILE),
                             max_concurrent=3, temporal=client, worker=True, task_queue=task_queue)
    await handle.handle.result()
    elsewhere = ProgressBoard()  # a board fed by no worker of this batch, but with a worker running
    elsewhere.workers = 1
    p = await Feed(handle.handle, total=3, board=elsewhere).read()
    assert p is not None and (p.finished, p.succeeded, p.done) == (3, 3, True)
