"""The seeds' placement and the rollout atom on the durable path: ``Taskset.run`` (a Temporal
workflow per rollout on a real dev server), an in-process worker unless said otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import seed_providers
from temporal_helpers import WorkerProcess

from durable_rollouts import LocalRuntime, Taskset, rollout
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.run import Run

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
GROUP_STATE = HERE / "envs" / "group_state.py"


def group_state() -> Taskset:
    return Taskset.from_file(GROUP_STATE)


async def test_a_group_of_four_is_isolated_on_the_durable_path(client, task_queue) -> None:
    job = await group_state().run(FixedAgent(answer="x"), runtime=LocalRuntime(GROUP_STATE),
                                  group=4, max_concurrent=4, temporal=client, worker=True,
                                  task_queue=task_queue)
    infos = [r.grade.info for r in job.runs]
    assert [r.status for r in job.runs] == ["succeeded"] * 4
    assert [(i["inits"], i["seen"]) for i in infos] == [(1, 1)] * 4
    assert len({i["env"] for i in infos}) == 4


async def test_a_provider_callable_runs_durably_and_exits_in_teardown(client, task_queue) -> None:
    seed_providers.EVENTS.clear()
    job = await group_state().run(FixedAgent(answer="x"), runtime=seed_providers.serve_group_state,
                                  group=2, temporal=client, worker=True, task_queue=task_queue)
    assert [r.status for r in job.runs] == ["succeeded"] * 2
    assert sorted(seed_providers.EVENTS) == ["enter probe"] * 2 + ["exit probe"] * 2


async def test_a_routing_lambda_runs_durably_with_an_in_process_worker(client, task_queue) -> None:
    providers = {"group-state": LocalRuntime(GROUP_STATE)}
    job = await group_state().run(FixedAgent(answer="x"),
                                  runtime=lambda task: providers[task.env](task),
                                  temporal=client, worker=True, task_queue=task_queue)
    assert job.runs[0].status == "succeeded" and job.runs[0].grade.info["inits"] == 1


async def test_rollout_returns_one_graded_run(client, task_queue) -> None:
    task = group_state()[0]
    run = await rollout(task, FixedAgent(answer="x"), runtime=LocalRuntime(GROUP_STATE),
                        temporal=client, worker=True, task_queue=task_queue)
    assert isinstance(run, Run) and run.status == "succeeded" and run.grade.reward == 1.0
    direct = await rollout(task, FixedAgent(answer="x"), durable=False)
    assert direct.status == "succeeded" and direct.grade.info["inits"] == 1


async def test_task_run_returns_a_job_and_defaults_its_placement(client, task_queue) -> None:
    job = await group_state()[0].run(FixedAgent(answer="x"), temporal=client, worker=True,
                                     task_queue=task_queue)
    assert isinstance(job, Job) and [r.status for r in job.runs] == ["succeeded"]


async def test_a_worker_elsewhere_imports_the_provider_by_path_and_exits_it_there(
        client, dev_server, task_queue, tmp_path: Path) -> None:
    events = tmp_path / "events"
    worker = WorkerProcess(dev_server.address, task_queue, env={
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SEED_EVENTS_FILE": str(events)})
    try:
        job = await group_state().run(FixedAgent(answer="x"), runtime=seed_providers.serve_group_state,
                                      group=2, temporal=client, worker=False, task_queue=task_queue)
        assert [r.status for r in job.runs] == ["succeeded"] * 2
        lines = [line.split(" ", 1) for line in events.read_text().splitlines()]
        assert sorted(e for _, e in lines) == ["enter probe"] * 2 + ["exit probe"] * 2
        assert {int(pid) for pid, _ in lines} == {worker.pid}  # entered and exited there

        from durable_rollouts.errors import ConfigError

        with pytest.raises(ConfigError, match="only exists in this process"):  # before it starts
            await group_state().run(FixedAgent(answer="x"), runtime=lambda task: None,
                                    temporal=client, worker=False, task_queue=task_queue)
    finally:
        worker.stop()


async def test_a_derived_taskset_runs_durably_with_its_lineage(client, task_queue) -> None:
    from test_derived_taskset import CHAT, Continue, Talker

    from durable_rollouts.sdk.derived import lineage
    from durable_rollouts.sdk.direct import run_direct

    first = await run_direct(Taskset.from_file(CHAT), Talker())
    job = await Continue(first).run(Talker(), group=2, temporal=client, worker=True,
                                    task_queue=task_queue)
    assert len(job.runs) == 2 * 2 * 2 and {r.status for r in job.runs} == {"succeeded"}
    assert {lineage(r.task)["job_id"] for r in job.runs} == {first.id}
    assert {r.trace.content for r in job.runs if lineage(r.task)["anchor"] == "after"} == {
        "turn 2 on tea", "turn 2 on rain"}


async def test_a_live_environment_and_a_builder_lambda_run_durably_in_process(
        client, task_queue) -> None:
    """``LocalRuntime(env)`` and ``LocalRuntime(lambda task: ...)`` reach an in-process worker
    as themselves; with workers elsewhere only, the batch is refused before it starts."""
    from durable_rollouts.envserver.loader import load_environment
    from durable_rollouts.errors import ConfigError

    env = load_environment(str(GROUP_STATE), fresh=True)
    live = await group_state().run(FixedAgent(answer="x"), runtime=LocalRuntime(env), group=2,
                                   temporal=client, worker=True, task_queue=task_queue)
    assert {r.grade.info["env"] for r in live.runs} == {id(env)}  # lent, one at a time
    build = LocalRuntime(lambda task: load_environment(str(GROUP_STATE), fresh=True))
    built = await group_state().run(FixedAgent(answer="x"), runtime=build, group=2,
                                    temporal=client, worker=True, task_queue=task_queue)
    assert [r.grade.info["inits"] for r in built.runs] == [1, 1]
    assert len({r.grade.info["env"] for r in built.runs}) == 2
    with pytest.raises(ConfigError, match="only exists in this process"):
        await group_state().run(FixedAgent(answer="x"), runtime=build, temporal=client,
                                worker=False, task_queue=task_queue)
