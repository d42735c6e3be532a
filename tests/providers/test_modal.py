"""ModalRuntime against a stand-in for the ``modal`` SDK boundary, plus a live test.

Modal's cloud cannot be reached from here, so these tests inject ``fake_modal.FakeModal`` as
the ``modal`` module: it records every SDK call and runs each "sandbox" as a real local env
server process, which the provider reaches through the stand-in's "tunnel" (a loopback port).
What is tested is the provider's side of the boundary: the calls and arguments it makes, tunnel
lookup, token, readiness, reuse by tag, early-death reporting and termination. The live test
runs only when MODAL_TOKEN_ID (and ROLLOUTS_MODAL_IMAGE, an env image Modal can pull) are set.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_modal import FakeModal
from substrates_support import ENV_IMAGE_DIR

from durable_rollouts.client.envclient import connect
from durable_rollouts.client.tokens import substrate_token
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import ProviderError
from durable_rollouts.models import RuntimeConfig, RuntimeGPU, RuntimeResources
from durable_rollouts.runtimes.modal import ModalRuntime

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


@pytest.fixture
def fake_modal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    fake = FakeModal(tmp_path)
    monkeypatch.setitem(sys.modules, "modal", fake)
    yield fake
    fake.shutdown()


def _runtime(env_file: str = "env.py", **kw: object) -> ModalRuntime:
    return ModalRuntime(
        "registry.example/env:1",
        env_vars={"ROLLOUTS_ENV_FILE": str(ENV_IMAGE_DIR / env_file)},
        **kw,
    )


def _creates(fake: FakeModal) -> list[tuple]:
    return [c for c in fake.calls if c[0] == "Sandbox.create"]


async def test_modal_runtime_creates_a_tunnelled_sandbox_and_terminates_it(fake_modal):
    config = RuntimeConfig(
        resources={"cpu": 2, "memory_mb": 1024, "gpu": 1}, limits={"run_timeout_s": 100}
    )
    runtime = _runtime(runtime_config=config, gpu_type="T4")
    key = f"modal-{uuid.uuid4().hex[:8]}"
    endpoint = await runtime.acquire(ENV.templates["count_letter"](), key)
    try:
        [(_, command, kwargs)] = _creates(fake_modal)
        assert command == ("rollouts-env",)
        assert kwargs["unencrypted_ports"] == [8765] and kwargs["timeout"] > 100
        assert kwargs["cpu"] == 2 and kwargs["memory"] == 1024 and kwargs["gpu"] == "T4:1"
        assert kwargs["image"] == ("image", "registry.example/env:1")
        assert kwargs["tags"]["durable-rollouts.key"] == key
        assert kwargs["env"]["ROLLOUTS_ENV_TOKEN"] == substrate_token(key)
        assert substrate_token(key) not in kwargs["tags"].values()  # tags are not secret
        assert "token" not in endpoint.params
        assert runtime.locality == "global"
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            await client.start_task("count_letter", {"word": "strawberry", "letter": "r"})
            assert (await client.grade("3"))["score"] == 1.0
    finally:
        await runtime.release(endpoint)
    sandbox = fake_modal.sandboxes[endpoint.handle["sandbox_id"]]
    assert sandbox.proc.poll() is not None
    await runtime.release(endpoint)  # idempotent


async def test_a_rows_gpu_type_and_count_win_over_the_providers_default_type(fake_modal):
    row = ENV.templates["count_letter"]().model_copy(update={"runtime_config": RuntimeConfig(
        resources=RuntimeResources(gpu=RuntimeGPU(type="A100", count=2)))})
    runtime = _runtime(gpu_type="T4")
    endpoint = await runtime.acquire(row, f"modal-{uuid.uuid4().hex[:8]}")
    try:
        [(_, _, kwargs)] = _creates(fake_modal)
        assert kwargs["gpu"] == "A100:2"
    finally:
        await runtime.release(endpoint)


async def test_a_retried_acquire_reuses_the_sandbox_tagged_with_its_key(fake_modal):
    key = f"modal-{uuid.uuid4().hex[:8]}"
    first = await _runtime().acquire(ENV.templates["count_letter"](), key)
    second = await _runtime().acquire(ENV.templates["count_letter"](), key)
    try:
        assert len(_creates(fake_modal)) == 1
        assert second.handle["sandbox_id"] == first.handle["sandbox_id"] and second.url == first.url
        assert second.params == first.params and "token" not in second.params
    finally:
        await _runtime().release(first)


async def test_a_sandbox_that_dies_early_reports_its_log_lines_and_is_terminated(fake_modal):
    with pytest.raises(ProviderError) as info:
        await _runtime("broken.py").acquire(ENV.templates["count_letter"](), "modal-broken")
    assert "broken-env: giving up on purpose" in str(info.value)
    assert [c for c in fake_modal.calls if c[0] == "terminate"]


def test_spec_round_trips_through_provider_from_spec():
    from durable_rollouts.runtimes import provider_from_spec

    runtime = ModalRuntime(
        "img",
        command=["serve"],
        port=9000,
        app_name="a",
        runtime_config=RuntimeConfig(limits={"run_timeout_s": 5}),
    )
    rebuilt = provider_from_spec(runtime.spec())
    assert isinstance(rebuilt, ModalRuntime) and rebuilt.spec() == runtime.spec()


@pytest.mark.skipif(
    not os.environ.get("MODAL_TOKEN_ID"),
    reason="live Modal test: needs MODAL_TOKEN_ID/MODAL_TOKEN_SECRET (Modal is unreachable here)",
)
async def test_live_modal_sandbox_serves_a_task():
    image = os.environ.get("ROLLOUTS_MODAL_IMAGE")
    if not image:
        pytest.skip("live Modal test: set ROLLOUTS_MODAL_IMAGE to an env image Modal can pull")
    runtime = ModalRuntime(image)
    key = f"live-{uuid.uuid4().hex[:8]}"
    endpoint = await runtime.acquire(ENV.templates["count_letter"](), key)
    try:
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            await client.start_task("count_letter", {})
            assert (await client.grade("3"))["score"] == 1.0
    finally:
        await runtime.release(endpoint)


async def test_a_durable_rollout_on_modal_records_the_card_steps(fake_modal, tmp_path):
    from durable_shape import CARD, durable_shapes

    from durable_rollouts.sdk.agents import FixedAgent

    job, shapes = await durable_shapes(_runtime(), [ENV.templates["count_letter"](word="banana", letter="a")],
                                       FixedAgent(answer="3"), tmp_path)
    assert [r.reward for r in job.runs] == [1.0], [r.error for r in job.runs]
    assert shapes == [CARD]
