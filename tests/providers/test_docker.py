"""DockerRuntime against a real Docker engine and the locally built test image (no registry).

Every container is labelled with its rollout key; each test counts containers by that label and
ends with none left. Skipped (with the reason) only when no Docker engine is reachable.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from substrates_support import ENV_IMAGE_DIR, TEST_KEY_PREFIX, containers_for

from durable_rollouts.client.envclient import connect
from durable_rollouts.client.tokens import substrate_token
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import ConfigError, ProviderError
from durable_rollouts.gc import LABEL_DEADLINE, LABEL_OWNER, collect, find_orphans
from durable_rollouts.models import RuntimeConfig, Task
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset

pytestmark = pytest.mark.docker

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


def _key() -> str:
    return f"{TEST_KEY_PREFIX}{uuid.uuid4().hex[:10]}"


def _task(template: str = "count_letter", **args: object) -> Task:
    return ENV.templates[template](**args)


async def test_docker_runtime_serves_a_task_over_the_published_port_and_release_removes_it(
    docker_client, test_image
):
    runtime = DockerRuntime(test_image)
    key = _key()
    endpoint = await runtime.acquire(_task(), key)
    try:
        assert endpoint.url.startswith("tcp://127.0.0.1:")
        assert "token" not in endpoint.params and endpoint.handle["container"]
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            prompt = await client.start_task("count_letter", {"word": "strawberry", "letter": "r"})
            assert "strawberry" in str(prompt)
            assert (await client.grade("3"))["score"] == 1.0
        [container] = containers_for(docker_client, key)
        assert container.labels["durable-rollouts.key"] == key
        assert f"ROLLOUTS_ENV_TOKEN={substrate_token(key)}" in container.attrs["Config"]["Env"]
        assert container.attrs["HostConfig"]["PortBindings"]["8765/tcp"][0]["HostIp"] == "127.0.0.1"
    finally:
        await runtime.release(endpoint)
    assert containers_for(docker_client, key) == []
    await runtime.release(endpoint)  # idempotent: already gone


async def test_env_refuses_a_client_without_the_container_token(docker_client, test_image):
    runtime = DockerRuntime(test_image)
    endpoint = await runtime.acquire(_task(), _key())
    try:
        from durable_rollouts.errors import UnauthorizedError

        with pytest.raises(UnauthorizedError):
            await connect(endpoint.url, token="wrong", ready_timeout=5)
    finally:
        await runtime.release(endpoint)


async def test_second_acquire_with_the_same_key_reuses_the_running_container(
    docker_client, test_image
):
    runtime = DockerRuntime(test_image)
    key = _key()
    first = await runtime.acquire(_task(), key)
    try:
        # A retried provision usually comes from a fresh worker: use a fresh provider object.
        second = await DockerRuntime(test_image).acquire(_task(), key)
        assert second.handle["id"] == first.handle["id"]
        assert second.url == first.url and second.params == first.params
        assert "token" not in second.params
        assert len(containers_for(docker_client, key)) == 1
    finally:
        await runtime.release(first)
    assert containers_for(docker_client, key) == []


async def test_concurrent_acquires_of_one_key_start_one_container(docker_client, test_image):
    key = _key()
    runtime = DockerRuntime(test_image)
    endpoints = await asyncio.gather(
        *(DockerRuntime(test_image).acquire(_task(), key) for _ in range(3))
    )
    try:
        assert len({e.handle["id"] for e in endpoints}) == 1
        assert len(containers_for(docker_client, key)) == 1
    finally:
        await runtime.release(endpoints[0])
    assert containers_for(docker_client, key) == []


async def test_acquire_replaces_a_dead_container_instead_of_adding_one(docker_client, test_image):
    runtime = DockerRuntime(test_image)
    key = _key()
    first = await runtime.acquire(_task(), key)
    try:
        docker_client.containers.get(first.handle["id"]).kill()
        second = await runtime.acquire(_task(), key)
        assert second.handle["id"] != first.handle["id"]
        [only] = containers_for(docker_client, key)
        assert only.id == second.handle["id"] and only.status == "running"
    finally:
        await runtime.release(first)
        await runtime.release(second)
    assert containers_for(docker_client, key) == []


async def test_early_death_error_carries_the_last_40_log_lines_and_leaves_nothing(
    docker_client, test_image
):
    runtime = DockerRuntime(test_image, env_vars={"ROLLOUTS_ENV_FILE": "/app/broken.py"})
    key = _key()
    with pytest.raises(ProviderError) as info:
        await runtime.acquire(_task(), key)
    message = str(info.value)
    assert "last 40 log lines" in message, message
    assert "broken-env: giving up on purpose" in message, message
    assert "broken-env line 59" in message and "broken-env line 10\n" not in message
    assert containers_for(docker_client, key) == []


async def test_resource_limits_and_an_unprivileged_sandbox_are_applied(docker_client, test_image):
    config = RuntimeConfig(resources={"cpu": 0.5, "memory_mb": 256}, limits={"run_timeout_s": 600})
    runtime = DockerRuntime(test_image, runtime_config=config)
    key = _key()
    endpoint = await runtime.acquire(_task(), key)
    try:
        [container] = containers_for(docker_client, key)
        host = container.attrs["HostConfig"]
        assert host["NanoCpus"] == 500_000_000
        assert host["Memory"] == 256 * 1024 * 1024
        assert host["PidsLimit"] == 512
        assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
        assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
        assert host["ReadonlyRootfs"] is True and "/tmp" in host["Tmpfs"]
        assert host["Privileged"] is False
        assert float(container.labels[LABEL_DEADLINE]) > time.time() + 500
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            prompt = await client.start_task("whoami", {})
        assert "uid=10001" in str(prompt)  # the image's unprivileged user, not root
    finally:
        await runtime.release(endpoint)
    assert containers_for(docker_client, key) == []


async def test_run_timeout_stops_the_env_inside_the_container(docker_client, test_image):
    runtime = DockerRuntime(test_image, runtime_config=RuntimeConfig(limits={"run_timeout_s": 2}))
    key = _key()
    endpoint = await runtime.acquire(_task(), key)
    try:
        container = docker_client.containers.get(endpoint.handle["id"])
        for _ in range(100):
            container.reload()
            if container.status == "exited":
                break
            await asyncio.sleep(0.1)
        assert container.status == "exited"
    finally:
        await runtime.release(endpoint)
    assert containers_for(docker_client, key) == []


async def test_a_gpu_request_on_an_engine_without_gpus_is_a_config_error_and_leaves_nothing(
    docker_client, test_image
):
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has an NVIDIA runtime")
    runtime = DockerRuntime(test_image, runtime_config=RuntimeConfig(resources={"gpu": 1}))
    key = _key()
    with pytest.raises(ConfigError, match="GPU"):
        await runtime.acquire(_task(), key)
    assert containers_for(docker_client, key) == []


def test_privileged_run_args_and_reserved_env_vars_are_rejected():
    with pytest.raises(ConfigError, match="privileged"):
        DockerRuntime("img", run_args={"privileged": True})
    with pytest.raises(ConfigError, match="ROLLOUTS_ENV_TOKEN"):
        DockerRuntime("img", env_vars={"ROLLOUTS_ENV_TOKEN": "x"})


async def test_a_missing_image_is_a_config_error(docker_client):
    with pytest.raises(ConfigError, match="docker/env.Dockerfile"):
        await DockerRuntime("durable-rollouts-no-such-image:nope").acquire(_task(), _key())


async def test_a_one_mebibyte_argument_travels_over_the_socket(docker_client, test_image):
    runtime = DockerRuntime(test_image)
    blob = "x" * (1024 * 1024)
    key = _key()
    endpoint = await runtime.acquire(_task("echo_size", blob=blob), key)
    try:
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            prompt = await client.start_task("echo_size", {"blob": blob})
            assert f"size={len(blob)}" in str(prompt)
            assert (await client.grade(str(len(blob))))["score"] == 1.0
    finally:
        await runtime.release(endpoint)


async def test_spec_round_trips_through_provider_from_spec():
    from durable_rollouts.runtimes import provider_from_spec

    runtime = DockerRuntime(
        "img",
        port=9000,
        runtime_config=RuntimeConfig(resources={"cpu": 1}),
        env_vars={"A": "b"},
        run_args={"read_only": False},
    )
    rebuilt = provider_from_spec(runtime.spec())
    assert isinstance(rebuilt, DockerRuntime)
    assert rebuilt.spec() == runtime.spec() and rebuilt.locality == "host"


async def test_a_batch_of_rollouts_runs_through_the_direct_executor_on_docker(
    docker_client, test_image
):
    tasks = [_task(word=w, letter="a") for w in ("banana", "papaya", "cat")]
    before = {
        c.id
        for c in docker_client.containers.list(all=True, filters={"label": "durable-rollouts.key"})
    }
    job = await run_direct(
        Taskset("docker-batch", tasks),
        FixedAgent(answer="3"),
        DockerRuntime(test_image),
        group=2,
        max_concurrent=6,
    )
    assert len(job.runs) == 6
    assert all(r.error is None for r in job.runs), [r.error for r in job.runs]
    rewards = sorted(r.reward for r in job.runs)
    assert rewards == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # banana and papaya have 3 a's, cat has 1
    after = {
        c.id
        for c in docker_client.containers.list(all=True, filters={"label": "durable-rollouts.key"})
    }
    assert after <= before


async def test_gc_removes_a_container_whose_owner_process_is_gone(
    docker_client, test_image, monkeypatch
):
    import durable_rollouts.gc as gc

    dead_pid = _dead_pid()
    real_labels = gc.owner_labels

    def labels_of_a_dead_owner(key, **kw):  # the substrate of a direct-path process that crashed
        return dict(real_labels(key, **kw), **{LABEL_OWNER: str(dead_pid)})

    monkeypatch.setattr(
        "durable_rollouts.runtimes.docker.owner_labels", labels_of_a_dead_owner
    )
    key = _key()
    await DockerRuntime(test_image).acquire(_task(), key)
    mine = await find_orphans(prefix=key)
    assert [o.reason for o in mine] == ["owner process gone"]
    dry = await collect(dry_run=True, prefix=key)
    assert dry and not dry[0].removed and len(containers_for(docker_client, key)) == 1
    removed = await collect(prefix=key)
    assert removed[0].removed
    assert containers_for(docker_client, key) == []


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_test_image_recipe_files_exist():
    repo = Path(__file__).resolve().parents[2]
    for name in (
        "env.Dockerfile",
        "base.Dockerfile",
        "make-base-image.sh",
        "rollouts-env",
        "README.md",
    ):
        assert (repo / "docker" / name).is_file(), name
    assert os.access(repo / "docker" / "make-base-image.sh", os.X_OK)
