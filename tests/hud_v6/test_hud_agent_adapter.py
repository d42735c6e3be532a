"""HUD v6 agents (subclasses of ``hud.agents.base.Agent``) as a rollout's agent: instance or class,
directly and through Temporal (rebuilt on the worker from ``module:Class`` plus ``dump()``)."""

from __future__ import annotations

import pytest

hud = pytest.importorskip("hud", reason="needs the hud package (HUD v6): pip install 'durable-rollouts[hud]'")

from hud_agents import LetterCounter, SuffixConfig, Suffixed, Unreachable  # noqa: E402
from hud_paths import QUICKSTART  # noqa: E402

from durable_rollouts import Taskset  # noqa: E402
from durable_rollouts.errors import ConfigError  # noqa: E402
from durable_rollouts.models import AgentSpec  # noqa: E402
from durable_rollouts.runtimes import LocalRuntime  # noqa: E402
from durable_rollouts.sdk.agents import HudAgent, as_agent, load_agent  # noqa: E402
from durable_rollouts.sdk.direct import run_direct  # noqa: E402
from durable_rollouts.temporal.batches import run_taskset  # noqa: E402


def _strawberry() -> Taskset:
    return Taskset.from_file(QUICKSTART).filter(lambda t: t.args["word"] == "strawberry")


@pytest.mark.parametrize("agent", [LetterCounter(), LetterCounter], ids=["instance", "class"])
async def test_a_hud_agent_instance_or_class_runs_directly(agent) -> None:
    job = await run_direct(Taskset.from_file(QUICKSTART), agent, LocalRuntime())
    assert [run.reward for run in job.runs] == [1.0, 1.0, 1.0]
    steps = job.runs[0].trace.steps
    assert steps[-1].source == "agent" and steps[-1].extra["hud"]["step_id"] == 1  # its trace came back


def test_a_hud_agent_travels_as_its_own_class_path_and_config() -> None:
    wrapped = as_agent(Suffixed(SuffixConfig(suffix="3", timeout_seconds=20)))
    spec = wrapped.spec()
    assert spec.path == "hud_agents:Suffixed" and spec.config["suffix"] == "3"
    assert wrapped.timeout_s == 20
    rebuilt = load_agent(spec)
    assert isinstance(rebuilt, HudAgent) and rebuilt.hud_instance().config == SuffixConfig(suffix="3", timeout_seconds=20)
    with pytest.raises(ConfigError, match="invalid config for HUD agent"):
        load_agent(AgentSpec(path="hud_agents:Suffixed", config={"suffix": ["not", "a", "str"]}))
    with pytest.raises(ConfigError, match="Agent or a HUD agent"):
        as_agent(object())


async def test_a_hud_agent_runs_through_temporal_rebuilt_from_its_spec(client, task_queue) -> None:
    job = await run_taskset(_strawberry(), Suffixed(SuffixConfig(suffix="3")), runtime=LocalRuntime(),
                            temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert run.status == "succeeded", run.error
    assert run.reward == 1.0 and run.trace.content == "3"


async def test_a_failing_hud_agent_puts_its_error_on_the_run_directly_and_durably(client, task_queue) -> None:
    direct = (await run_direct(_strawberry(), Unreachable(), LocalRuntime())).runs[0]
    durable = (await run_taskset(_strawberry(), Unreachable(), runtime=LocalRuntime(), temporal=client,
                                 worker=True, task_queue=task_queue)).runs[0]
    for run in (direct, durable):
        assert run.status == "errored" and run.error_phase == "agent loop"
        assert run.error == "RuntimeError: model unreachable"
        assert run.grade is not None and run.grade_reward == 0.0  # still graded, best effort
