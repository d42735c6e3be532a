"""Seed 003's taskset flags: ``REQUIRES_GROUP_ROLLOUTS`` refuses single rollouts and
``NEEDS_CONTAINER`` refuses runtimes that run no container, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts import LocalRuntime, SubprocessRuntime, Taskset
from durable_rollouts.errors import ConfigError
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct

GROUP_STATE = Path(__file__).parent / "envs" / "group_state.py"


class GroupOnly(Taskset):
    REQUIRES_GROUP_ROLLOUTS = True

    def resolve_task(self, task):  # binds per-group state: every member must share it
        return task.model_copy(update={"args": {**task.args, "hold": 0.05}})


def rows(cls: type[Taskset] = Taskset) -> Taskset:
    return cls("flags", list(Taskset.from_file(GROUP_STATE)))


async def test_a_group_only_taskset_refuses_single_rollouts_and_runs_groups() -> None:
    with pytest.raises(ConfigError, match=r"requires group rollouts.*group >= 2, not 1"):
        await run_direct(rows(GroupOnly), FixedAgent(answer="x"), LocalRuntime(GROUP_STATE))
    with pytest.raises(ConfigError, match="requires group rollouts"):
        await rows(GroupOnly).run(FixedAgent(answer="x"), runtime=LocalRuntime(GROUP_STATE))
    job = await run_direct(rows(GroupOnly), FixedAgent(answer="x"), LocalRuntime(GROUP_STATE), group=2)
    assert [r.status for r in job.runs] == ["succeeded"] * 2
    assert {r.task.args["hold"] for r in job.runs} == {0.05}


@pytest.mark.parametrize("runtime", [None, LocalRuntime(GROUP_STATE), SubprocessRuntime(GROUP_STATE)])
async def test_a_taskset_that_needs_a_container_refuses_host_runtimes(runtime) -> None:
    ts = rows()
    ts.NEEDS_CONTAINER = True  # per instance, e.g. from its config
    with pytest.raises(ConfigError, match=r"needs a container \(NEEDS_CONTAINER\).*DockerRuntime"):
        await run_direct(ts, FixedAgent(answer="x"), runtime)
    with pytest.raises(ConfigError, match="needs a container"):
        await ts.start(FixedAgent(answer="x"), runtime=runtime)
