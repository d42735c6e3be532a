"""Seed 000's ``Agent``: a plain subclassable class (``class Agent(ABC)`` with ``async
__call__(run)``). A subclass with its own ``__init__`` that sets plain attributes, as HUD writes
agents, works on the direct path (the object itself) and on the durable path (rebuilt on the
worker from its class path and its ``__init__`` arguments)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts import LocalRuntime, Taskset
from durable_rollouts.agents import Agent, FixedAgent
from durable_rollouts.errors import ConfigError
from durable_rollouts.eval import Run
from durable_rollouts.models import AgentSpec
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.direct import run_direct

LETTER_COUNT = Path(__file__).parent / "envs" / "letter_count.py"


class LetterCounter(Agent):
    """Counts the letter in the prompt's word; its settings are plain attributes (HUD style)."""

    def __init__(self, model: str = "counter-small", letter: str = "r", **options: object) -> None:
        self.model = model
        self.letter = letter
        self.options = options
        self.calls = 0

    async def __call__(self, run: Run) -> None:
        word = run.prompt_text.split("'")[3]  # How many 'r's are in 'strawberry'?
        self.calls += 1
        run.trace.content = f"{word.count(self.letter)} by {self.model}"


class TimedCounter(LetterCounter):
    """A subclass whose ``__init__`` calls ``super().__init__`` and sets the step timeout."""

    def __init__(self, model: str = "counter-timed") -> None:
        super().__init__(model=model, letter="r")
        self.timeout_s = 30.0


class WithClient(Agent):
    def __init__(self, client: object) -> None:
        self.client = client

    async def __call__(self, run: Run) -> None:
        run.trace.content = ""


def test_a_hud_style_init_sets_plain_attributes_and_travels_as_its_arguments() -> None:
    agent = LetterCounter("counter-large", temperature=0.2)
    assert (agent.model, agent.letter, agent.options, agent.calls) == (
        "counter-large", "r", {"temperature": 0.2}, 0)
    spec = agent.spec()
    assert spec == AgentSpec(path=f"{__name__}:LetterCounter",
                             config={"model": "counter-large", "temperature": 0.2})
    rebuilt = load_agent(spec)
    assert type(rebuilt) is LetterCounter and (rebuilt.model, rebuilt.options) == (
        "counter-large", {"temperature": 0.2})

    timed = TimedCounter()
    assert (timed.model, timed.letter, timed.timeout_s) == ("counter-timed", "r", 30.0)
    assert timed.spec().config == {} and load_agent(timed.spec()).timeout_s == 30.0

    with pytest.raises(ConfigError, match="client=object, which is not JSON data"):
        WithClient(object()).spec()
    with pytest.raises(ConfigError, match="invalid config for agent .*unexpected keyword"):
        load_agent(AgentSpec(path=f"{__name__}:TimedCounter", config={"letter": "x"}))
    # pydantic-field agents are as before: config is their fields, unknown names refused
    assert FixedAgent(answer="3").spec() == AgentSpec(path="fixed", config={"answer": "3"})
    with pytest.raises(ValueError, match='no field "model"'):
        FixedAgent().model = "x"  # type: ignore[attr-defined]


async def test_a_hud_style_agent_runs_directly_as_the_object_itself() -> None:
    agent = LetterCounter()
    job = await run_direct(Taskset.from_file(LETTER_COUNT), agent, LocalRuntime(LETTER_COUNT))
    assert [(r.trace.content, r.grade.reward) for r in job.runs] == [
        ("3 by counter-small", 1.0), ("3 by counter-small", 1.0), ("2 by counter-small", 1.0)]
    assert agent.calls == 3


@pytest.mark.slow
async def test_a_hud_style_agent_is_rebuilt_on_the_worker_from_its_arguments(client, task_queue) -> None:
    job = await Taskset.from_file(LETTER_COUNT).run(
        LetterCounter(model="counter-large"), runtime=LocalRuntime(LETTER_COUNT),
        temporal=client, worker=True, task_queue=task_queue)
    assert [(r.trace.content, r.grade.reward) for r in job.runs] == [
        ("3 by counter-large", 1.0), ("3 by counter-large", 1.0), ("2 by counter-large", 1.0)]
    assert job.agent == AgentSpec(path=f"{__name__}:LetterCounter", config={"model": "counter-large"})
