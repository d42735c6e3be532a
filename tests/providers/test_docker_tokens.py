"""DockerRuntime's token is derived from the rollout key, never stored: real engine, real Temporal.

The container's ``ROLLOUTS_ENV_TOKEN`` is ``substrate_token(key)``; the Endpoint carries no token,
so a durable rollout's workflow histories (raw protobuf of every event, payloads unencoded) hold
neither the token nor the worker secret. A worker with another secret is refused with a message
naming ``ROLLOUTS_TOKEN_SECRET``, and its acquire replaces the container instead of reusing it.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from history_scan import job_histories
from substrates_support import (
    ENV_IMAGE_DIR,
    KEY_LABEL,
    TEST_KEY_PREFIX,
    MarkingSleepAgent,
    containers_for,
)
from test_docker_durable import _job_containers, _wait

from durable_rollouts.client.envclient import connect
from durable_rollouts.client.tokens import SECRET_ENV_VAR, secret_path, substrate_token
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import UnauthorizedError
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.step_io import ConnectInput
from durable_rollouts.steps import substrate as steps
from durable_rollouts.temporal.batches import start_job

pytestmark = pytest.mark.docker

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


def _container_token(container: Any) -> str:
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"] if "=" in e)
    return env["ROLLOUTS_ENV_TOKEN"]



async def test_a_docker_rollouts_workflow_history_holds_no_substrate_token_or_secret(
    docker_client, test_image, client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv(SECRET_ENV_VAR, raising=False)  # the per-home secret file
    marker = tmp_path / "agents.log"
    handle = await start_job(
        Taskset("docker-history", [ENV.templates["count_letter"]()]),
        MarkingSleepAgent(marker=str(marker), seconds=3.0, answer="3"),
        runtime=DockerRuntime(test_image),
        temporal=client,
        worker=True,
        task_queue=f"docker-hist-{uuid.uuid4().hex[:8]}",
    )
    await asyncio.to_thread(_wait, marker.exists, 90, "the agent to start")
    [container] = _job_containers(docker_client, handle.job.id)  # alive while the agent runs
    key = container.labels[KEY_LABEL]
    token = _container_token(container)
    assert token == substrate_token(key)  # the substrate's real token is the derived one
    job = await asyncio.wait_for(handle.wait(), 120)
    [run] = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error

    raw = await job_histories(client, job)
    assert key.encode() in raw and b'"token_from":"key"' in raw  # the scan sees the Endpoint
    assert token.encode() not in raw
    assert secret_path().read_bytes() not in raw
    assert _job_containers(docker_client, job.id) == []


async def test_a_worker_with_another_secret_is_told_to_share_it_and_replaces_the_container(
    docker_client, test_image, monkeypatch: pytest.MonkeyPatch
):
    key = f"{TEST_KEY_PREFIX}{uuid.uuid4().hex[:10]}"
    runtime = DockerRuntime(test_image)
    monkeypatch.setenv(SECRET_ENV_VAR, "host-a")
    first = await runtime.acquire(ENV.templates["count_letter"](), key)
    second = None
    try:
        monkeypatch.setenv(SECRET_ENV_VAR, "host-b")  # a worker on another host
        with pytest.raises(UnauthorizedError) as info:
            await steps.connect(ConnectInput(endpoint=first, ready_timeout_s=10))
        message = str(info.value)
        assert "ROLLOUTS_TOKEN_SECRET" in message and "\n" not in message, message

        second = await DockerRuntime(test_image).acquire(ENV.templates["count_letter"](), key)
        assert second.handle["id"] != first.handle["id"]  # not reused: its token is unknown here
        [only] = containers_for(docker_client, key)
        assert only.id == second.handle["id"] and _container_token(only) == substrate_token(key)
        session = await steps.connect(ConnectInput(endpoint=second))
        assert session.env_name
    finally:
        await runtime.release(first)
        if second is not None:
            await runtime.release(second)
    assert containers_for(docker_client, key) == []


async def test_the_provider_face_yields_a_runtime_carrying_its_token(docker_client, test_image):
    async with DockerRuntime(test_image)(ENV.templates["count_letter"]()) as runtime:
        async with await connect(runtime.url, token=runtime.params["token"]) as env_client:
            await env_client.start_task("count_letter", {"word": "strawberry", "letter": "r"})
            assert (await env_client.grade("3"))["score"] == 1.0
        assert "token_from" not in runtime.params
