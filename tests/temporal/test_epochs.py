"""Epochs of a taskset in one batch (issue #39 item 2), on a real dev server with real envs.

``Taskset.run(..., epochs=3, seed=7)`` runs every row three times, each epoch in its own order,
the rows loaded by the batch from pages in storage (the workflow input holds only the manifest's
uri); every rollout is its own (one agent call each) and graded. ``Taskset.start(..., epochs=2)``
streams every epoch's groups to its consumer. Bad ``epochs`` is one clear error and starts nothing.
"""

from __future__ import annotations

import asyncio

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, read_lines

from durable_rollouts import session
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job
from durable_rollouts.temporal.jobs import load_job
from durable_rollouts.temporal.live import JobClosedError
from durable_rollouts.workflows import workflow_id


def _taskset(n: int) -> Taskset:
    return Taskset("epochs", [Task(env="counting", id="echo", source=ENV_FILE,
                                   args={"expected": "x", "tag": f"row{i}"}) for i in range(n)])


async def test_three_epochs_run_every_row_three_times_each_epoch_in_its_own_order(
        client, task_queue, tmp_path) -> None:
    log = tmp_path / "agents.log"
    job = await _taskset(5).run(CountingAgent(answer="x", log=str(log)), runtime=LocalRuntime(ENV_FILE),
                                group=2, epochs=3, seed=7, temporal=client, worker=True,
                                task_queue=task_queue, max_concurrent=8)
    assert len(job.runs) == 30 and {r.status for r in job.runs} == {"succeeded"}
    assert {r.reward for r in job.runs} == {1.0}
    assert len({r.rollout_id for r in job.runs}) == 30  # a new rollout in every epoch
    assert sorted(line.split()[1] for line in read_lines(log)) == sorted(r.rollout_id for r in job.runs)
    assert {r.group_index for r in job.runs} == {0, 1}
    orders = []
    for epoch in range(3):
        runs = [r for r in job.runs if epoch * 5 <= r.row_index < (epoch + 1) * 5]
        assert len(runs) == 10 and len({r.group_id for r in runs}) == 5
        tags = [r.task.args["tag"] for r in sorted(runs, key=lambda r: r.row_index)][::2]
        assert sorted(tags) == [f"row{i}" for i in range(5)]
        orders.append(tags)
    assert len({tuple(o) for o in orders}) > 1, orders  # seeded orders differ (seed 7: all three)
    view = await get_job(job.id, temporal=client)  # what `rollouts show` reads: every position once
    assert sorted(r.rollout_id for r in view.runs) == sorted(r.rollout_id for r in job.runs)
    assert {r.status for r in view.runs} == {"succeeded"}
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    start = history.events[0].workflow_execution_started_event_attributes.input.payloads[0].data
    assert b'"rows":[]' in start and b"row0" not in start  # rows come from pages, by activity


async def test_a_streamed_job_delivers_every_epochs_groups(client, task_queue) -> None:
    async with session():
        job = await _taskset(3).start(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=2,
                                      epochs=2, temporal=client, worker=True, task_queue=task_queue,
                                      consumers=["trainer"], linger_s=60)
        groups = []
        async for batch in job.stream(consumer="trainer", batch_size=2):
            groups.extend(batch.groups)
            await batch.ack()
    assert len(groups) == 6 and all(len(g) == 2 for g in groups)
    assert len({g[0].group_id for g in groups}) == 6
    assert {r.reward for g in groups for r in g} == {1.0}


async def test_epochs_none_runs_epoch_after_epoch_until_the_job_is_closed(client, task_queue) -> None:
    """``epochs=None``: the rows again and again, each epoch in its own order, until
    ``job.close()``; then the group in progress finishes, nothing more starts, the job closes and
    its consumer got every group that ran, once."""
    async with session():
        job = await _taskset(3).start(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=2,
                                      epochs=None, seed=5, temporal=client, worker=True,
                                      task_queue=task_queue, consumers=["trainer"], max_in_flight=2,
                                      linger_s=60)
        groups, closed, running_view = [], False, None
        async for batch in job.stream(consumer="trainer", batch_size=1):
            groups.extend(batch.groups)
            if len(groups) == 4:  # a reader of the running job lists the rows it reached, no more
                running_view = await load_job(client, job.id)  # what `rollouts show` reads
            try:
                await batch.ack()
            except JobClosedError:  # closed, it finished without waiting for our last acks
                assert closed
            if len(groups) >= 8 and not closed:  # past two epochs of 3 rows
                await job.close()
                closed = True
        done = await job.wait()
    assert closed and 8 <= len(groups) <= 8 + 2  # at most max_in_flight groups ran past the close
    assert len({g[0].group_id for g in groups}) == len(groups) and all(len(g) == 2 for g in groups)
    assert sorted(r.rollout_id for r in done.runs) == sorted(r.rollout_id for g in groups for r in g)
    by_epoch: dict[int, list[str]] = {}
    for run in done.runs[::2]:
        by_epoch.setdefault(run.row_index // 3, []).append(run.task.args["tag"])
    assert sorted(by_epoch[0]) == sorted(by_epoch[1]) == ["row0", "row1", "row2"]
    assert running_view is not None and 4 * 2 <= len(running_view.runs) <= (4 + 3) * 2
    assert sum(r.status == "succeeded" for r in running_view.runs) >= 4 * 2
    view = await get_job(job.id, temporal=client)  # only the rows it reached, all succeeded
    assert len(view.runs) == len(done.runs) and {r.status for r in view.runs} == {"succeeded"}


async def test_epochs_none_needs_a_streamed_job(client, task_queue) -> None:
    with pytest.raises(ConfigError, match="epochs=None .* needs a streamed job"):
        await _taskset(2).run(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), epochs=None,
                              temporal=client, worker=True, task_queue=task_queue)


@pytest.mark.parametrize("epochs", [-1, 0, 2.5, "3"])
async def test_bad_epochs_are_one_clear_error_and_start_nothing(client, task_queue, epochs) -> None:
    with pytest.raises(ConfigError, match="epochs") as err:
        await _taskset(2).run(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), epochs=epochs,
                              temporal=client, worker=True, task_queue=task_queue)
    assert "\n" not in str(err.value)


async def test_resume_re_runs_an_epochs_batchs_errored_rollouts_under_their_own_ids(
        client, task_queue) -> None:
    """Every position of every epoch keeps its rollout id, so a resume replaces exactly the
    errored rollouts (no new ones, none twice)."""
    from durable_rollouts.sdk.agents import FailAgent
    from durable_rollouts.temporal.resume import plan_resume, start_resume

    async with session():
        job = await _taskset(2).run(FailAgent(), runtime=LocalRuntime(ENV_FILE), epochs=2, seed=3,
                                    temporal=client, worker=True, task_queue=task_queue)
        assert [r.status for r in job.runs] == ["errored"] * 4
        plans = plan_resume(await load_job(client, job.id), None)
        assert sum(len(p.rerun) for p in plans) == 4
        for plan in plans:
            await (await start_resume(client, job.id, plan)).result()
        after = await load_job(client, job.id)
    assert sorted(r.rollout_id for r in after.runs) == sorted(r.rollout_id for r in job.runs)
    assert [r.status for r in after.runs] == ["errored"] * 4
    for run in job.runs:  # each ran twice under its one id: the first run, then the resume
        for _ in range(50):  # (visibility may lag a moment)
            runs = [w async for w in client.list_workflows(f'WorkflowId="{run.rollout_id}"')]
            if len(runs) >= 2:
                break
            await asyncio.sleep(0.1)
        assert len(runs) == 2, (run.rollout_id, len(runs))
