"""ModalRuntime: a worker SIGKILLed between ``Sandbox.create`` and its answer leaves no orphan.

Modal's cloud is unreachable here, so the workers import the shared stand-in
(``fake_modal.FakeModal(dir, shared=True)`` through ``modal_shim/``): every process sees the same
sandboxes, each a real env server process that outlives the worker that made it. The stand-in
makes the first sandbox, then holds the create's answer; the test SIGKILLs that worker. The
provision retried on a second worker must find the sandbox by its key tag and adopt it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dying_create import logged_lifetimes, run_with_a_dying_create
from fake_modal import FakeModal
from substrates_support import ENV_IMAGE_DIR

from durable_rollouts.envserver import load_environment
from durable_rollouts.runtimes.modal import ModalRuntime
from durable_rollouts.sdk.agents import FixedAgent

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


async def test_a_worker_killed_mid_create_leaves_one_sandbox_per_rollout_and_none_after(
    client, temporal_address, tmp_path
):
    cloud = tmp_path / "modal"
    cloud.mkdir()
    (cloud / "hold-create").touch()
    runtime = ModalRuntime("registry.example/env:1",
                           env_vars={"ROLLOUTS_ENV_FILE": str(ENV_IMAGE_DIR / "env.py")})
    try:
        tasks = [ENV.templates["count_letter"](word=w, letter="a") for w in ("banana", "cat", "kayak")]
        done = await run_with_a_dying_create(
            client=client, address=temporal_address, runtime=runtime, tasks=tasks,
            agent=FixedAgent(answer="3"), create_held=(cloud / "create-held").exists,
            env={"FAKE_MODAL_DIR": str(cloud),
                 "PYTHONPATH": f"{HERE / 'modal_shim'}:{HERE}:{HERE.parent / 'temporal'}"})
        assert [r.status for r in done.job.runs] == ["succeeded"] * 3, [r.error for r in done.job.runs]
        assert sorted(r.reward for r in done.job.runs) == [0.0, 0.0, 1.0]  # banana has 3
        seen = logged_lifetimes(cloud / "events.log")
        assert len(seen.made) == len(set(seen.made)) == 3  # the held one was adopted
        assert set(seen.most.values()) == {1}  # never two sandboxes for one rollout
        assert seen.alive == 0
        assert [sb for sb in FakeModal(cloud, shared=True)._on_disk() if sb.proc.poll() is None] == []
    finally:
        FakeModal(cloud, shared=True).shutdown()
