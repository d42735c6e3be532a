"""DockerRuntime on the durable path: Taskset.run through Temporal, a SIGKILLed worker, and gc.

A real ``temporal server start-dev`` (one per module), real worker processes
(``python -m durable_rollouts.worker``) and real containers from the locally built test image.
Container creations are counted from the Docker engine's own event log, so a duplicated
container would be seen even if it was removed again.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from history_scan import step_names
from substrates_support import ENV_IMAGE_DIR, KEY_LABEL, MarkingSleepAgent
from temporal_helpers import WorkerProcess

from durable_rollouts.envserver import load_environment
from durable_rollouts.gc import collect, find_orphans
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

HERE = Path(__file__).resolve().parent
TEMPORAL_TESTS = HERE.parent / "temporal"

pytestmark = pytest.mark.docker

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def Worker(address: str, queue: str) -> WorkerProcess:
    """A worker process that can also import this directory's agents (substrates_support)."""
    return WorkerProcess(address, queue, env={"PYTHONPATH": os.pathsep.join([str(HERE), str(TEMPORAL_TESTS)])})


def _created_keys(docker_client, since: float, job_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Rollout keys of every container the engine created for ``job_id`` since ``since``."""
    events = docker_client.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "create"},
    )
    keys = [e["Actor"]["Attributes"].get(KEY_LABEL, "") for e in events]
    return [k for k in keys if k.startswith(f"job-{job_id}")]


def _job_containers(docker_client, job_id: str) -> list[object]:  # type: ignore[no-untyped-def]
    return [
        c
        for c in docker_client.containers.list(all=True, filters={"label": KEY_LABEL})
        if c.labels[KEY_LABEL].startswith(f"job-{job_id}")
    ]


async def test_twenty_rollouts_run_through_taskset_run_on_docker(docker_client, test_image, client):
    words = ["banana", "papaya", "cat", "alpaca", "kayak"]
    tasks = [ENV.templates["count_letter"](word=w, letter="a") for w in words]
    since = time.time()
    job = await Taskset("docker-durable", tasks).run(
        FixedAgent(answer="3"),
        runtime=DockerRuntime(test_image),
        group=4,
        max_concurrent=10,
        temporal=client,
        worker=True,
        task_queue=f"docker-{uuid.uuid4().hex[:8]}",
    )
    assert len(job.runs) == 20
    assert [r.status for r in job.runs] == ["succeeded"] * 20, [r.error for r in job.runs]
    expected = {"banana": 1.0, "papaya": 1.0, "cat": 0.0, "alpaca": 1.0, "kayak": 0.0}
    assert sorted(r.reward for r in job.runs) == sorted(
        expected[w] for w in words for _ in range(4)
    )
    created = _created_keys(docker_client, since, job.id)
    assert len(created) == 20 and len(set(created)) == 20  # one container per rollout, no extras
    for run in job.runs[:2]:  # the card's steps, as every runtime records them
        history = await client.get_workflow_handle(run.rollout_id).fetch_history()
        assert step_names(history) == ["provision", "connect", "start", "agent", "grade", "teardown"]
    assert _job_containers(docker_client, job.id) == []  # every one removed by teardown


async def test_a_sigkilled_worker_mid_rollout_reuses_the_container_after_the_retry(
    docker_client, test_image, client, temporal_address, tmp_path, monkeypatch
):
    """SIGKILL the worker while the agent runs: the agent step retries on a second worker, which
    reconnects to the same container (one creation event for the rollout key), and succeeds."""
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # the dead worker's agent step: noticed soon
    queue = f"docker-kill-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "agents.log"
    first = Worker(temporal_address, queue)
    second = None
    job_id = ""
    try:
        since = time.time()
        handle = await start_job(
            Taskset("docker-kill", [ENV.templates["count_letter"]()]),
            MarkingSleepAgent(marker=str(marker), seconds=3.0, answer="3"),
            runtime=DockerRuntime(test_image),
            temporal=client,
            worker=False,
            task_queue=queue,
        )
        job_id = handle.job.id
        await asyncio.to_thread(_wait, marker.exists, 60, "the agent to start")
        first.kill()  # mid-agent
        [container] = _job_containers(docker_client, job_id)
        second = Worker(temporal_address, queue)
        job = await asyncio.wait_for(handle.wait(), 90)
        [run] = job.runs
        assert (run.status, run.reward) == ("succeeded", 1.0), run.error
        starts = marker.read_text().splitlines()
        assert len(starts) == 2 and starts[1].startswith(f"{second.proc.pid} ")  # retried there
        created = _created_keys(docker_client, since, job_id)
        assert created == [container.labels[KEY_LABEL]]  # the retry reused it: no second container
        assert _job_containers(docker_client, job_id) == []
    finally:
        first.kill()
        if second is not None:
            second.stop()
        for leftover in _job_containers(docker_client, job_id) if job_id else []:
            leftover.remove(force=True)  # only when the test failed before teardown ran


async def test_gc_removes_containers_of_closed_workflows_and_keeps_running_ones(
    docker_client, test_image, client
):
    from temporalio.common import RetryPolicy

    runtime = DockerRuntime(test_image)
    open_id, closed_id = (f"job-gc{uuid.uuid4().hex[:6]}-t-0" for _ in range(2))
    for wf_id in (open_id, closed_id):  # workflows nobody executes: running until terminated
        await client.start_workflow(
            "NoSuchWorkflow",
            id=wf_id,
            task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
    await client.get_workflow_handle(closed_id).terminate("done")
    endpoints = [
        await runtime.acquire(ENV.templates["count_letter"](), wf_id)
        for wf_id in (open_id, closed_id)
    ]
    try:
        orphans = [o for o in await find_orphans(client) if o.key in (open_id, closed_id)]
        assert [(o.key, o.reason) for o in orphans] == [(closed_id, "workflow terminated")]
        removed = await collect(client, prefix=closed_id)
        assert [o.removed for o in removed] == [True]
        assert [
            c.labels[KEY_LABEL]
            for c in docker_client.containers.list(all=True, filters={"label": KEY_LABEL})
            if c.labels[KEY_LABEL] in (open_id, closed_id)
        ] == [open_id]
    finally:
        for endpoint in endpoints:
            await runtime.release(endpoint)
        await client.get_workflow_handle(open_id).terminate("test over")
