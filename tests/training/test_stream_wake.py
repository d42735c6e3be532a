"""A caught-up consumer is woken by the batch (the ``stream_wait`` update), not by polling.
Real dev server, real envs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from stream_views import count_views
from temporal_helpers import ENV_FILE, CountingAgent

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.workflows import workflow_id


def _rows(evidence: Path, n: int) -> Taskset:
    return Taskset("wake", [Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(evidence / "grades.log"), "tag": f"row{i}"}) for i in range(n)])


async def test_a_caught_up_consumer_is_woken_by_the_batch_not_by_polling(
        client, task_queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that has read everything waits with the ``stream_wait`` update: the batch
    completes it once the groups it wants are delivered. With a 60 s poll interval the stream of
    groups finishing over several seconds still ends long before one poll would, the batch's
    history holds the waits, and the views are a few per batch, not one per poll. A newer wait of
    the same consumer ends the older one (a consumer holds one wait at most)."""
    rows = 6
    slow = [f"row{i}" for i in range(1, rows)]  # row0 at once, the rest 1.5 s later, one group each
    job = await _rows(tmp_path, rows).start(
        CountingAgent(answer="x", slow_tags=slow, slow_seconds=1.5), runtime=LocalRuntime(ENV_FILE),
        temporal=client, worker=True, task_queue=task_queue, consumers=["trainer"], max_concurrent=1)
    views = count_views(monkeypatch)
    seen: list[str] = []
    async def read() -> None:
        async for batch in job.stream(consumer="trainer", batch_size=2, poll_s=60):
            seen.extend(r.group_id for r in batch.records)
            await batch.ack()
    await asyncio.wait_for(read(), 45)  # a poll every 60 s could not have read 3 batches by now
    assert len(seen) == len(set(seen)) == rows
    assert views() <= 2 * rows + 2, views()
    handle = client.get_workflow_handle(workflow_id(job.id))
    waits = [e async for e in handle.fetch_history_events()
             if e.HasField("workflow_execution_update_accepted_event_attributes")
             and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
             == "stream_wait"]
    assert waits, "the consumer never waited on the batch"
    await asyncio.wait_for(job.wait(), 60)

    # one wait at most per consumer: a second one from the same name ends the first
    job2 = await _rows(tmp_path, 1).start(CountingAgent(answer="x", seconds=30),
                                          runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
                                          task_queue=task_queue, consumers=["trainer"])
    h2 = client.get_workflow_handle(workflow_id(job2.id))
    first = asyncio.ensure_future(h2.execute_update("stream_wait", {"consumer": "trainer", "start": 0}))
    await asyncio.sleep(1.0)
    assert not first.done()
    second = asyncio.ensure_future(h2.execute_update("stream_wait", {"consumer": "trainer", "start": 0}))
    assert await asyncio.wait_for(first, 20) == 0  # ended by the newer wait, nothing delivered yet
    assert not second.done()
    await job2.cancel()
    second.cancel()

