"""A worker that stops mid-batch leaves no suspended workflow coroutine for the garbage collector.

temporalio 1.35 does not evict idle cached runs at shutdown; Python would later close their
coroutines on whatever thread collects, running a ``finally`` (our teardown step) inside another
workflow's activation (``durable_rollouts.temporal.eviction``). These tests stop a worker while a
rollout waits on its agent step, then look for that rollout's ``Rollout.run`` coroutine: it must
be closed, not suspended. The batch still finishes on the next worker, graded exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import uuid
from datetime import timedelta
from pathlib import Path
from types import CoroutineType

import pytest
from temporal_helpers import ENV_FILE, read_lines
from temporalio.client import Client
from temporalio.worker import Worker

from durable_rollouts import worker as worker_module
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import SleepAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal import batches
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.board import BOARD
from durable_rollouts.temporal.eviction import cached_runs
from durable_rollouts.temporal.plugin import RolloutsPlugin
from durable_rollouts.workflows import Rollout, rollout_id

pytestmark = pytest.mark.timeout(120)


def _suspended_rollouts(job_id: str) -> list[CoroutineType]:
    """``Rollout.run`` coroutines of ``job_id`` that are still suspended (not closed); matched by
    name and file, since a sandboxed worker runs its own import of the module."""
    code = Rollout.run.__code__
    found = []
    for obj in gc.get_objects():
        # type(), not isinstance: sandbox proxies left by earlier tests refuse __class__
        if (type(obj) is CoroutineType and obj.cr_code.co_qualname == code.co_qualname
                and obj.cr_code.co_filename == code.co_filename
                and inspect.getcoroutinestate(obj) == inspect.CORO_SUSPENDED):
            inp = obj.cr_frame.f_locals.get("inp")
            if getattr(inp, "job_id", None) == job_id:
                found.append(obj)
    return found


async def _start_in_agent(client: Client, queue: str, tmp_path: Path):
    task = Task(env="counting", id="echo", source=ENV_FILE,
                args={"expected": "x", "grade_log": str(tmp_path / "grades.log")})
    handle = await start_job(Taskset("evict", [task]), SleepAgent(seconds=3.0, answer="x"),
                             runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=queue)
    child = client.get_workflow_handle(rollout_id(handle.job.id, task.slug, 0))

    for _ in range(400):
        with contextlib.suppress(Exception):  # not started yet
            if (await child.query(Rollout.phase))["phase"] == "agent loop":
                return handle
        await asyncio.sleep(0.05)
    raise AssertionError("the rollout never reached its agent step")


@pytest.mark.parametrize("attributes", [True, False], ids=["search-attributes", "no-search-attributes"])
async def test_a_worker_stopped_mid_agent_step_evicts_its_cached_runs(
        client, monkeypatch, tmp_path: Path, attributes: bool) -> None:
    """Stopped while the rollout waits on its agent: no run stays cached, no ``Rollout.run``
    coroutine stays suspended, the board does not count the evicted rollout as cancelled (also
    without search attributes, where the rollout publishes nothing on its way out), and the next
    worker finishes the rollout with one real grade."""
    if not attributes:
        async def no_attributes(_client: Client) -> bool:
            return False

        monkeypatch.setattr(batches, "ensure_search_attributes", no_attributes)
    queue = f"evict-{uuid.uuid4().hex[:8]}"
    first = worker_module.build_worker(client, task_queue=queue, graceful_shutdown_s=0.5)
    async with first:
        handle = await _start_in_agent(client, queue, tmp_path)
        assert _suspended_rollouts(handle.job.id), "the probe must see the live run before the stop"
    assert all(not cached_runs(w) for w in first.workers)
    assert _suspended_rollouts(handle.job.id) == []
    seen = BOARD.get(handle.handle.id)
    assert seen is not None and seen.counts["cancelled"] == 0, seen
    async with worker_module.build_worker(client, task_queue=queue):
        result = await handle.handle.result()
    assert [(r.status, r.reward) for r in result.results] == [("succeeded", 1.0)]
    assert len(read_lines(tmp_path / "grades.log")) == 1


async def test_a_plain_worker_with_the_plugin_evicts_its_cached_runs(dev_server, tmp_path: Path) -> None:
    """The same through ``RolloutsPlugin`` on a bare temporalio ``Worker``."""
    queue = f"evict-plugin-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(dev_server.address, plugins=[RolloutsPlugin(task_queue=queue)])
    worker = Worker(client, task_queue=queue, graceful_shutdown_timeout=timedelta(seconds=0.5))
    async with worker:
        handle = await _start_in_agent(client, queue, tmp_path)
        assert _suspended_rollouts(handle.job.id)
    assert not cached_runs(worker)
    assert _suspended_rollouts(handle.job.id) == []
    async with Worker(client, task_queue=queue):
        result = await handle.handle.result()
    assert [(r.status, r.reward) for r in result.results] == [("succeeded", 1.0)]
