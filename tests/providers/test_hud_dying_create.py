"""HUDRuntime: a worker SIGKILLed between the session create and its answer leaves no orphan.

The workers talk to ``fake_hud.HUDStandIn`` (in this test process, so it outlives them), which
starts the first session's env, then never answers that create; the test SIGKILLs the worker.
The provision retried on a second worker must find the session by its key-derived trace id and
adopt it; rollouts whose tunnels died with the first worker reprovision onto their sessions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dying_create import lifetimes, run_with_a_dying_create
from fake_hud import API_KEY, HUDStandIn
from substrates_support import REPO

from durable_rollouts.envserver import load_environment
from durable_rollouts.runtimes.hud import HUDRuntime
from durable_rollouts.sdk.agents import FixedAgent

pytestmark = pytest.mark.slow

LETTERS = REPO / "examples" / "letters" / "env.py"
ENV = load_environment(str(LETTERS))


async def test_a_worker_killed_mid_create_leaves_one_session_per_rollout_and_none_after(
    client, temporal_address, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    gateway = HUDStandIn({"letters": LETTERS}, tmp_path).start()
    gateway.hold_create = True
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "5")  # a dead worker's tunnels: reprovision soon
    try:
        tasks = [ENV.templates["count_letter"](word=w, letter="a") for w in ("banana", "cat", "kayak")]
        done = await run_with_a_dying_create(
            client=client, address=temporal_address, runtime=HUDRuntime(), tasks=tasks,
            agent=FixedAgent(answer="3"), create_held=lambda: gateway.create_held,
            env={"HUD_API_KEY": API_KEY, "HUD_RUNTIME_URL": gateway.url})
        assert [r.status for r in done.job.runs] == ["succeeded"] * 3, [r.error for r in done.job.runs]
        assert sorted(r.reward for r in done.job.runs) == [0.0, 0.0, 1.0]  # banana has 3
        seen = lifetimes(list(gateway.events))
        assert len(seen.made) == len(set(seen.made)) == 3  # the held one was adopted
        assert set(seen.most.values()) == {1}  # never two sessions for one rollout
        assert seen.alive == 0 and gateway.sessions == {}
    finally:
        gateway.stop()
