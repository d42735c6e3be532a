"""DaytonaRuntime: a worker SIGKILLed between the sandbox create and its answer leaves no orphan.

The workers run the real ``daytona`` SDK against ``fake_daytona.DaytonaStandIn`` (in this test
process, so it outlives them). The stand-in makes the first sandbox, then never answers that
create; the test SIGKILLs the worker. The provision retried on a second worker must find the
sandbox by its key-derived name and adopt it; rollouts whose forwards died with the first worker
reprovision onto the same sandboxes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dying_create import lifetimes, run_with_a_dying_create
from fake_daytona import API_KEY, DaytonaStandIn
from substrates_support import REPO

from durable_rollouts.envserver import load_environment
from durable_rollouts.runtimes.daytona import DaytonaRuntime
from durable_rollouts.sdk.agents import FixedAgent

pytestmark = pytest.mark.slow

LETTERS = REPO / "examples" / "letters"
ENV = load_environment(str(LETTERS / "env.py"))
ANY_PORT = "python -m durable_rollouts.envserver env.py --host 127.0.0.1 --port 0"


async def test_a_worker_killed_mid_create_leaves_one_sandbox_per_rollout_and_none_after(
    client, temporal_address, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cloud = DaytonaStandIn(tmp_path / "daytona").start()
    cloud.add_snapshot("letters-env")
    cloud.hold_create = True
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "5")  # a dead worker's forwards: reprovision soon
    env = {"DAYTONA_API_KEY": API_KEY, "DAYTONA_API_URL": cloud.api_url,
           "DAYTONA_TARGET": "standin", "ROLLOUTS_DAYTONA_KNOWN_HOSTS": str(cloud.known_hosts)}
    runtime = DaytonaRuntime("letters-env", ssh_host=cloud.ssh_host, workdir=str(LETTERS),
                             command=ANY_PORT)
    try:
        tasks = [ENV.templates["count_letter"](word=w, letter="a") for w in ("banana", "cat", "kayak")]
        done = await run_with_a_dying_create(
            client=client, address=temporal_address, runtime=runtime, tasks=tasks,
            agent=FixedAgent(answer="3"), create_held=lambda: cloud.create_held, env=env)
        assert [r.status for r in done.job.runs] == ["succeeded"] * 3, [r.error for r in done.job.runs]
        assert sorted(r.reward for r in done.job.runs) == [0.0, 0.0, 1.0]  # banana has 3
        seen = lifetimes(list(cloud.events))
        assert len(seen.made) == len(set(seen.made)) == 3  # the held one was adopted
        assert set(seen.most.values()) == {1}  # never two sandboxes for one rollout
        assert seen.alive == 0 and cloud.sandboxes == {}
    finally:
        cloud.stop()
