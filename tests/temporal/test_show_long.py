"""``rollouts show`` on a job longer than it lists one by one reads counters, not every rollout.

On a training job of 100,000 rollouts the full reader (``jobs.load_job``) reads every result
chunk and describes every running child; ``show`` there prints each batch's counters (the final
result's, or the live ``progress`` query's) and its latest finished rollouts, reading at most one
result chunk per batch. The threshold is lowered here so the job stays small.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for

from durable_rollouts.cli import views
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.stores import results as result_store


def _taskset(n: int) -> Taskset:
    return Taskset("long", [Task(env="counting", id="echo", source=ENV_FILE,
                                 args={"expected": "x", "tag": f"row{i}"}) for i in range(n)])


async def _show(address: str, job_id: str, *, every: bool = False) -> str:
    out = io.StringIO()
    code = await views.show(Console(file=out, width=220), job_id, temporal=address, as_json=False,
                            connect_timeout=5.0, every=every)
    assert code == 0
    return out.getvalue()


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lists above 10 rollouts are long; counts the result chunks read and forbids the full reader."""
    monkeypatch.setattr(views, "SHOW_EVERY_ROLLOUT", 10)
    chunks: list[int] = []
    real_get = result_store.ResultStore.get

    def counted(ref):  # type: ignore[no-untyped-def]
        chunks.append(1)
        return real_get(ref)

    monkeypatch.setattr(result_store.ResultStore, "get", staticmethod(counted))
    return chunks


async def test_a_long_finished_job_shows_its_counters_and_latest_rollouts(
        client, dev_server, task_queue, small_threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    job = await _taskset(12).run(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=2,
                                 temporal=client, worker=True, task_queue=task_queue)
    assert len(job.runs) == 24

    def no_full_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the summary must not read every rollout")

    with monkeypatch.context() as patch:
        patch.setattr(views, "load_job", no_full_read)
        text = await _show(dev_server.address, job.id)
    assert "status   completed" in text
    assert "24 of 24 finished (24 succeeded); mean reward 1.000; 1 workflow run(s); counters final" in text
    assert "latest 20 finished rollouts" in text and f"rollouts show {job.id} --all" in text
    assert len(small_threshold) <= 1  # at most the newest chunk

    every = await _show(dev_server.address, job.id, every=True)  # --all: one line per rollout
    assert "24 rollouts: 24 succeeded" in every and "latest 20" not in every


@pytest.mark.slow  # a live job watched while it runs (~6 s)
async def test_a_long_running_job_shows_live_counters(
        client, dev_server, task_queue, small_threshold, tmp_path: Path) -> None:
    log = tmp_path / "agents.log"
    job = await _taskset(16).start(CountingAgent(answer="x", seconds=1.0, log=str(log)),
                                   runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
                                   task_queue=task_queue, max_concurrent=4, linger_s=0.1)
    await async_wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 6,
                         timeout=60, what="six rollouts started")
    text = await _show(dev_server.address, job.id)
    assert "status   running" in text and "counters live" in text
    assert "of 16 finished" in text and "running" in text
    await asyncio.wait_for(job.wait(), 120)
    done = await _show(dev_server.address, job.id)
    assert "16 of 16 finished (16 succeeded)" in done
