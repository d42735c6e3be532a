"""Agents travel as data (import path + config) and come back as the same agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_rollouts import Agent, Run
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import AgentSpec, Task, Trace
from durable_rollouts.sdk.agents import FixedAgent, SleepAgent, TableAgent, check_remote, load_agent


class AnswerThree(Agent):
    async def __call__(self, run: Run) -> None:
        run.trace.content = "3"


class Configured(Agent):
    model: str = "small"
    temperature: float = 0.0

    async def __call__(self, run: Run) -> None:
        run.trace.content = f"{self.model}@{self.temperature}"


async def test_an_agent_with_no_fields_works_and_round_trips() -> None:
    run = Run(task=Task(env="e", id="t"), trace=Trace())
    await AnswerThree()(run)
    assert run.trace.content == "3"
    spec = AnswerThree().spec()
    assert spec.path.endswith(":AnswerThree") and spec.config == {}
    assert isinstance(load_agent(spec), AnswerThree)


def test_config_travels_with_the_spec() -> None:
    spec = Configured(model="big", temperature=0.5, timeout_s=3).spec()
    agent = load_agent(AgentSpec.model_validate_json(spec.model_dump_json()))
    assert isinstance(agent, Configured) and (agent.model, agent.temperature, agent.timeout_s) == ("big", 0.5, 3)


def test_builtins_load_by_short_name() -> None:
    assert FixedAgent(answer="x").spec() == AgentSpec(path="fixed", config={"answer": "x"})
    assert load_agent(AgentSpec(path="sleep", config={"seconds": 0.1, "answer": "y"})) == SleepAgent(seconds=0.1, answer="y")
    assert isinstance(load_agent("fail"), Agent)
    table = load_agent(AgentSpec(path="table", config={"answers": {"t": "by id"}, "default": "d"}))
    assert isinstance(table, TableAgent) and table.default == "d"


async def test_table_agent_prefers_the_slug_then_the_task_id() -> None:
    task = Task(env="e", id="count", args={"w": "x"})
    agent = TableAgent(answers={task.slug: "by slug", "count": "by id"}, default="none")
    run = Run(task=task)
    await agent(run)
    assert run.trace.content == "by slug"
    other = Run(task=Task(env="e", id="count", args={"w": "y"}))
    await agent(other)
    assert other.trace.content == "by id"


@pytest.mark.parametrize("path, message", [
    ("no_such_module_abc:Agent", "cannot import agent module 'no_such_module_abc'"),
    ("durable_rollouts.sdk.agents:Nope", "has no attribute 'Nope'"),
    ("durable_rollouts.models:Task", "not a durable_rollouts Agent"),
    ("not a path", "neither a built-in"),
])
def test_bad_agent_paths_are_config_errors(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_agent(AgentSpec(path=path))


def test_bad_agent_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid config"):
        load_agent(AgentSpec(path="fixed", config={"answer": "x", "surprise": 1}))


def test_an_agent_defined_in_a_function_cannot_become_a_spec() -> None:
    class Local(Agent):
        async def __call__(self, run: Run) -> None: ...

    with pytest.raises(ConfigError, match="module level"):
        Local().spec()


def test_a_main_module_agent_is_a_clear_error_in_another_process(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "from durable_rollouts.sdk.agents import Agent\n"
        "class Mine(Agent):\n"
        "    async def __call__(self, run):\n"
        "        run.trace.content = 'x'\n"
        "print(Mine().spec().model_dump_json())\n"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=repo,
                         env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"}, timeout=30)
    spec = AgentSpec.model_validate_json(out.stdout.strip().splitlines()[-1])
    assert spec.path == "__main__:Mine"  # fine for the embedded worker in that same process
    with pytest.raises(ConfigError, match="move it to a module"):
        check_remote(spec)
    check_remote(FixedAgent(answer="x").spec())
    with pytest.raises(ConfigError, match="__main__"):
        load_agent(spec)  # here, __main__ is pytest: the class is not there
