"""DaytonaRuntime through the real ``daytona`` SDK, against a local stand-in for Daytona's cloud.

Daytona's cloud is unreachable here, so ``fake_daytona.DaytonaStandIn`` replaces it: an HTTP
server on 127.0.0.1 implementing the REST and toolbox endpoints the SDK calls (the SDK is pointed
at it with ``DAYTONA_API_URL``) and an asyncssh server standing in for the SSH gateway. Nothing
else is replaced: the SDK makes its real requests, each sandbox's env server is a real process
started by the session command the runtime sends, and the control channel of every rollout runs
through a real SSH local-forward. What the stand-in cannot show is the cloud's own behaviour
(image builds, resource limits, TTLs): those requests are only checked as sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
from fake_daytona import API_KEY, DaytonaStandIn
from substrates_support import ENV_IMAGE_DIR, REPO

from durable_rollouts.client.envclient import connect
from durable_rollouts.client.tokens import substrate_token
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import ConfigError, ProviderError
from durable_rollouts.models import RuntimeConfig
from durable_rollouts.runtimes import daytona as daytona_module
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.runtimes.base import container_name
from durable_rollouts.runtimes.daytona import DaytonaRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.step_io import (
    ConnectInput,
    GradeInput,
    ProvisionInput,
    StartInput,
    TeardownInput,
)
from durable_rollouts.steps import substrate as steps

LETTERS = REPO / "examples" / "letters"
ENV = load_environment(str(LETTERS / "env.py"))
SNAPSHOT = "letters-env"


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DaytonaStandIn]:
    standin = DaytonaStandIn(tmp_path / "daytona").start()
    standin.add_snapshot(SNAPSHOT)
    monkeypatch.setenv("DAYTONA_API_KEY", API_KEY)
    monkeypatch.setenv("DAYTONA_API_URL", standin.api_url)
    monkeypatch.setenv("DAYTONA_TARGET", "standin")
    monkeypatch.setenv("ROLLOUTS_DAYTONA_KNOWN_HOSTS", str(standin.known_hosts))
    yield standin
    daytona_module._FORWARDS.clear()
    standin.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runtime(cloud: DaytonaStandIn, snapshot: str | None = SNAPSHOT,
             **kw: object) -> DaytonaRuntime:
    kw.setdefault("workdir", str(LETTERS))
    kw.setdefault("port", _free_port())  # the stand-in's sandboxes share this machine's ports
    return DaytonaRuntime(snapshot, ssh_host=cloud.ssh_host, **kw)  # type: ignore[arg-type]


def _task(**args: object):  # type: ignore[no-untyped-def]
    return ENV.templates["count_letter"](**args)


def _key() -> str:
    return f"daytona-{uuid.uuid4().hex[:8]}"


async def test_acquire_boots_the_snapshot_serves_through_the_ssh_gateway_and_release_deletes(
    cloud, caplog
):
    caplog.set_level(logging.INFO, logger="asyncssh")
    runtime = _runtime(cloud)
    key = _key()
    endpoint = await runtime.acquire(_task(), key)
    sandbox = cloud.sandbox_named(container_name(key))
    assert sandbox is not None and endpoint.handle["sandbox_id"] == sandbox.id
    try:
        [created] = cloud.posted("/api/sandbox")
        assert created["snapshot"] == SNAPSHOT and created["autoStopInterval"] == 0
        assert created["autoDeleteInterval"] == 0  # ephemeral
        assert created["ttlMinutes"] == (3600 + 600) // 60
        assert created["labels"]["durable-rollouts.key"] == key
        assert created["labels"]["durable-rollouts.provider"] == "daytona"
        assert created["env"]["ROLLOUTS_ENV_TOKEN"] == substrate_token(key)
        assert substrate_token(key) not in json.dumps(endpoint.model_dump())  # not in history
        assert cloud.ssh_tokens.keys().isdisjoint(json.dumps(endpoint.model_dump()).split('"'))
        [(command, proc)] = [(c.command, c.proc) for c in sandbox.sessions[
            daytona_module.SESSION].values()]
        assert command == (f"cd {LETTERS} && python -m durable_rollouts.envserver env.py "
                           f"--host 127.0.0.1 --port {runtime.port}")
        assert endpoint.url.startswith("tcp://127.0.0.1:")
        assert endpoint.handle["remote_port"] == runtime.port
        assert int(endpoint.url.rsplit(":", 1)[1]) != runtime.port  # a forward, not the server
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            await client.start_task("count_letter", {"word": "banana", "letter": "a"})
            assert (await client.grade("3"))["score"] == 1.0
        assert ("127.0.0.1", runtime.port) in cloud.forwards  # through the gateway
        [ssh_token] = cloud.ssh_tokens
        assert "Auth for user <daytona-ssh-token> succeeded" in caplog.text
        assert ssh_token not in caplog.text  # the access token is the SSH user name
    finally:
        await runtime.release(endpoint)
    assert cloud.sandbox_named(container_name(key)) is None and proc.poll() is not None
    assert key not in daytona_module._FORWARDS
    await runtime.release(endpoint)  # idempotent


async def test_a_retried_acquire_in_a_fresh_process_reuses_the_sandbox_and_its_server(cloud):
    key = _key()
    runtime = _runtime(cloud)
    first = await runtime.acquire(_task(), key)
    try:
        daytona_module._FORWARDS.clear()  # a new worker process starts so (its forwards died)
        second = await provider_from_spec(runtime.spec()).acquire(_task(), key)
        assert second.handle == first.handle and second.params == first.params
        assert len(cloud.posted("/api/sandbox")) == 1
        assert len([p for m, p, _ in cloud.calls if m == "POST" and p.endswith("/exec")]) == 1
        async with await connect(second.url, token=substrate_token(key)) as client:
            assert await client.start_task("count_letter", {})
    finally:
        await runtime.release(first)


async def test_the_durable_steps_run_a_rollout_through_the_forward(cloud):
    """provision -> connect -> start -> grade -> teardown, each from the recorded data only."""
    task, key = _task(word="strawberry", letter="r"), _key()
    endpoint = await steps.provision(ProvisionInput(key=key, task=task,
                                                    provider=_runtime(cloud).spec()))
    endpoint = type(endpoint).model_validate_json(endpoint.model_dump_json())  # as in history
    session = await steps.connect(ConnectInput(endpoint=endpoint))
    prompt = await steps.start(StartInput(endpoint=endpoint, session=session, task=task))
    assert "strawberry" in json.dumps(prompt)
    grade = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="3"))
    assert grade.reward == 1.0
    await steps.teardown(TeardownInput(endpoint=endpoint, session=session))
    assert not cloud.sandboxes


async def test_a_batch_of_rollouts_runs_through_the_direct_executor(cloud):
    # Concurrent stand-in sandboxes share this machine's ports: each server takes a free one,
    # which the runtime reads from its announcement and forwards to.
    any_port = "python -m durable_rollouts.envserver env.py --host 127.0.0.1 --port 0"
    tasks = [_task(word=w, letter="a") for w in ("banana", "cat")]
    job = await run_direct(Taskset("daytona-batch", tasks), FixedAgent(answer="3"),
                           _runtime(cloud, command=any_port), group=2, max_concurrent=4)
    assert [r.error for r in job.runs] == [None] * 4
    assert sorted(r.reward for r in job.runs) == [0.0, 0.0, 1.0, 1.0]
    assert len(cloud.deleted) == 4 and not cloud.sandboxes and not daytona_module._FORWARDS
    assert len({port for _, port in cloud.forwards}) == 4


async def test_a_missing_snapshot_is_built_from_the_image_with_the_resources(cloud):
    config = RuntimeConfig(resources={"cpu": 2, "memory_mb": 1500, "gpu": 1},
                           limits={"run_timeout_s": 120})
    runtime = _runtime(cloud, "fresh-snap", image="registry.example/letters:1",
                       runtime_config=config)
    endpoint = await runtime.acquire(_task(), _key())
    try:
        [snapshot] = cloud.posted("/api/snapshots")
        assert snapshot["name"] == "fresh-snap"
        assert snapshot["imageName"] == "registry.example/letters:1"
        assert (snapshot["cpu"], snapshot["memory"], snapshot["gpu"]) == (2, 2, 1)
        [created] = cloud.posted("/api/sandbox")
        assert created["snapshot"] == "fresh-snap" and created["ttlMinutes"] == 12
    finally:
        await runtime.release(endpoint)
    # The snapshot now exists with those resources: a second runtime boots it without a build.
    again = _runtime(cloud, "fresh-snap", runtime_config=config)
    await again.release(await again.acquire(_task(), _key()))
    assert len(cloud.posted("/api/snapshots")) == 1


async def test_an_image_in_the_runtime_config_boots_that_image(cloud):
    task = _task().model_copy(update={"runtime_config": RuntimeConfig(
        image="registry.example/other:2", resources={"cpu": 1, "memory_mb": 512})})
    runtime = _runtime(cloud)
    await runtime.release(await runtime.acquire(task, _key()))
    [created] = cloud.posted("/api/sandbox")
    assert "snapshot" not in created or created["snapshot"] is None
    assert "registry.example/other:2" in created["buildInfo"]["dockerfileContent"]
    assert (created["cpu"], created["memory"]) == (1, 1)


async def test_what_daytona_cannot_honour_is_a_config_error(cloud):
    with pytest.raises(ConfigError, match="whole cpus"):
        await _runtime(cloud, runtime_config=RuntimeConfig(resources={"cpu": 1.5})).acquire(
            _task(), _key())
    with pytest.raises(ConfigError, match="fixed when it is built"):
        await _runtime(cloud, runtime_config=RuntimeConfig(resources={"cpu": 4})).acquire(
            _task(), _key())
    with pytest.raises(ConfigError, match="not found; pass DaytonaRuntime"):
        await _runtime(cloud, "no-such-snapshot").acquire(_task(), _key())
    with pytest.raises(ConfigError, match="needs a snapshot name"):
        DaytonaRuntime()
    assert not cloud.posted("/api/sandbox")  # all refused before a sandbox was booted


async def test_an_env_that_dies_while_loading_reports_its_log_and_the_sandbox_is_deleted(cloud):
    runtime = _runtime(cloud, workdir=str(ENV_IMAGE_DIR), command=(
        "python -m durable_rollouts.envserver broken.py --host 127.0.0.1 --port 0"))
    with pytest.raises(ProviderError) as info:
        await runtime.acquire(_task(), _key())
    assert "exited with code" in str(info.value)
    assert "broken-env: giving up on purpose" in str(info.value)
    assert not cloud.sandboxes and len(cloud.deleted) == 1


async def test_a_gateway_with_another_host_key_is_refused(cloud, tmp_path, monkeypatch):
    other = asyncssh.generate_private_key("ssh-ed25519")
    bad = tmp_path / "bad_known_hosts"
    bad.write_text(f"[127.0.0.1]:{cloud.ssh_port} {other.export_public_key().decode()}")
    monkeypatch.setenv("ROLLOUTS_DAYTONA_KNOWN_HOSTS", str(bad))
    with pytest.raises(ConfigError, match="refused"):
        await _runtime(cloud).acquire(_task(), _key())
    assert not cloud.sandboxes  # deleted after the failed forward


async def test_rejected_credentials_are_a_config_error(cloud, monkeypatch):
    monkeypatch.setenv("DAYTONA_API_KEY", "wrong")
    with pytest.raises(ConfigError, match="rejected the credentials"):
        await _runtime(cloud).acquire(_task(), _key())
    monkeypatch.delenv("DAYTONA_API_KEY")
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        await _runtime(cloud).acquire(_task(), _key())


async def test_a_missing_daytona_package_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "daytona", None)  # as if not installed
    monkeypatch.setenv("DAYTONA_API_KEY", "set")
    with pytest.raises(ConfigError, match=r"durable-rollouts\[daytona\]"):
        await DaytonaRuntime("snap").acquire(_task(), _key())
    assert DaytonaRuntime.list_substrates() == []  # gc goes on without it


_ABANDON = """
import asyncio, os, sys
from durable_rollouts.envserver import load_environment
from durable_rollouts.models import ProviderSpec
from durable_rollouts.runtimes import provider_from_spec

async def main():
    runtime = provider_from_spec(ProviderSpec.model_validate_json(sys.argv[1]))
    endpoint = await runtime.acquire(load_environment(sys.argv[2]).templates["count_letter"](),
                                     sys.argv[3])
    print(endpoint.handle["sandbox_id"], flush=True)
    os._exit(0)  # the owner dies without releasing

asyncio.run(main())
"""


async def test_gc_deletes_the_sandbox_of_an_owner_that_died(cloud):
    from durable_rollouts.gc import collect, find_orphans

    key = _key()
    mine = await _runtime(cloud).acquire(_task(), f"{key}-live")
    try:
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _ABANDON, _runtime(cloud).spec().model_dump_json(),
             str(LETTERS / "env.py"), f"{key}-dead"],
            capture_output=True, text=True, timeout=90,
        )
        assert out.returncode == 0, out.stderr
        sandbox_id = out.stdout.split()[-1]
        orphans = await find_orphans(prefix=key)
        assert [(o.kind, o.key, o.reason) for o in orphans] == [
            ("daytona", f"{key}-dead", "owner process gone")]
        await collect(prefix=key)
        assert sandbox_id in cloud.deleted and sandbox_id not in cloud.sandboxes
        assert mine.handle["sandbox_id"] in cloud.sandboxes  # its owner (this process) lives
    finally:
        await _runtime(cloud).release(mine)


def test_spec_round_trips_and_the_cli_names_it():
    from durable_rollouts.cli.specs import parse_runtime

    runtime = DaytonaRuntime("snap", image="img", command="serve", workdir="/w", port=9000,
                             ssh_host="gw.example:2222", ssh_expires_minutes=60,
                             runtime_config=RuntimeConfig(limits={"run_timeout_s": 5}))
    rebuilt = provider_from_spec(runtime.spec())
    assert isinstance(rebuilt, DaytonaRuntime) and rebuilt.spec() == runtime.spec()
    assert rebuilt.locality == "process"
    cli = parse_runtime("daytona:my-snapshot")
    assert isinstance(cli, DaytonaRuntime) and cli.snapshot_name == "my-snapshot"
    with pytest.raises(ConfigError, match="snapshot name"):
        parse_runtime("daytona:")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        DaytonaRuntime("snap", ssh_host="gw:notaport")


async def test_a_durable_rollout_on_daytona_records_the_card_steps(cloud, tmp_path):
    from durable_shape import CARD, durable_shapes

    job, shapes = await durable_shapes(_runtime(cloud), [_task(word="banana", letter="a")],
                                       FixedAgent(answer="3"), tmp_path)
    assert [r.reward for r in job.runs] == [1.0], [r.error for r in job.runs]
    assert shapes == [CARD]
