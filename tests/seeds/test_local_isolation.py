"""Seed 001, "Fresh substrate per rollout": LocalRuntime gives each rollout its own Environment.

A path is loaded per rollout (its sibling imports stay cached), a ``(task) -> Environment``
callable is called per rollout, a live Environment serves one rollout at a time, and
``shared=True`` keeps the one shared server it asks for.
"""

from __future__ import annotations

import sys
from pathlib import Path

from durable_rollouts import LocalRuntime, Taskset
from durable_rollouts.environment import Environment
from durable_rollouts.envserver.loader import load_environment
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct

ENVS = Path(__file__).parent / "envs"
GROUP_STATE = ENVS / "group_state.py"


def _infos(job) -> list[dict]:
    assert [r.status for r in job.runs] == ["succeeded"] * len(job.runs), [r.error for r in job.runs]
    return [r.grade.info for r in job.runs]


def _overlapping(infos: list[dict]) -> bool:
    return max(i["began"] for i in infos) < min(i["ended"] for i in infos)


async def test_four_concurrent_group_members_each_initialize_their_own_environment() -> None:
    before = {m for m in sys.modules if m.startswith("_rollouts_env_")}
    job = await run_direct(Taskset.from_file(GROUP_STATE), FixedAgent(answer="x"),
                           LocalRuntime(GROUP_STATE), group=4, max_concurrent=4)
    infos = _infos(job)
    assert [(i["inits"], i["seen"]) for i in infos] == [(1, 1)] * 4  # only their own state
    assert len({i["env"] for i in infos}) == 4  # four Environments
    assert _overlapping(infos)  # and they ran at the same time
    assert len({i["helper"] for i in infos}) == 1  # the file's own import loaded once
    assert {m for m in sys.modules if m.startswith("_rollouts_env_")} == before  # loads dropped


async def test_shared_true_keeps_one_server_for_the_group() -> None:
    job = await run_direct(Taskset.from_file(GROUP_STATE), FixedAgent(answer="x"),
                           LocalRuntime(GROUP_STATE, shared=True), group=4, max_concurrent=4)
    infos = _infos(job)
    assert {i["inits"] for i in infos} == {1} and len({i["env"] for i in infos}) == 1
    assert sorted(i["seen"] for i in infos)[-1] == 4  # they see each other, as asked


async def test_a_live_environment_serves_one_rollout_at_a_time() -> None:
    env = load_environment(str(GROUP_STATE))
    module = sys.modules[env.templates["probe"].fn.__module__]
    inits = module.state["inits"]
    job = await run_direct(Taskset.from_file(GROUP_STATE), FixedAgent(answer="x"),
                           LocalRuntime(env), group=3, max_concurrent=3)
    infos = _infos(job)
    assert {i["env"] for i in infos} == {id(env)}
    windows = sorted((i["began"], i["ended"]) for i in infos)
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:]))  # never two at once
    assert module.state["inits"] == inits + 3 and module.state["stops"] >= 3  # hooks per rollout


async def test_a_builder_is_called_per_rollout_with_the_placed_row() -> None:
    built: list[str] = []

    def build(task) -> Environment:
        env = Environment(name="built")

        @env.template(id=task.id)
        async def probe(hold: float = 0.0):
            answer = yield "say anything"
            yield {"score": 1.0, "info": {"env": id(env)}}

        built.append(task.id)
        return env

    job = await run_direct(Taskset.from_file(GROUP_STATE), FixedAgent(answer="x"),
                           LocalRuntime(build), group=3, max_concurrent=3)
    assert built == ["probe"] * 3 and len({i["env"] for i in _infos(job)}) == 3
