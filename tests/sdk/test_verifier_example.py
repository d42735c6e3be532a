"""examples/verifier: a verifier task grades the actor's result, on its server or its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts import LocalRuntime, SubprocessRuntime
from durable_rollouts.envserver.loader import import_file
from durable_rollouts.sdk.agents import FailAgent, TableAgent
from durable_rollouts.sdk.direct import run_direct

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verifier"


def _tasks():
    """examples/verifier/tasks.py, which imports its sibling modules (spelling, referee)."""
    return import_file(EXAMPLE / "tasks.py", "verifier_example_tasks")


@pytest.mark.parametrize("kind", ["local", "subprocess"])
@pytest.mark.parametrize("setup", ["same_env", "separate_env"])
async def test_verifier_decides_the_reward(kind: str, setup: str) -> None:
    taskset = getattr(_tasks(), setup)
    runtime = LocalRuntime() if kind == "local" else SubprocessRuntime()
    # "reward" is "drawer" reversed but not "stressed" reversed; the actor grade says 1.0 for both
    job = await run_direct(taskset, TableAgent(default="reward"), runtime)
    assert [r.reward for r in job.runs] == [1.0, 0.0]
    for run in job.runs:
        assert run.trace.extra["actor_grade"]["reward"] == 1.0
        assert run.status == "succeeded"


async def test_verifier_sees_a_failed_actor_as_an_error_frame() -> None:
    job = await run_direct(_tasks().separate_env, FailAgent(message="no model"), LocalRuntime())
    assert [r.grade_reward for r in job.runs] == [0.0, 0.0]  # graded best effort ...
    assert [r.reward for r in job.runs] == [None, None]  # ... but an errored run has no reward
    assert all(r.grade.content == "the actor produced no gradable result" for r in job.runs)
