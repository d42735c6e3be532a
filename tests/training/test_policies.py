"""Rewards that mean what a trainer thinks, and the batch policies (retries, on_error), on a real
dev server with an in-process worker and agents that fail on purpose."""

from __future__ import annotations

import json

from temporal_helpers import ENV_FILE
from training_agents import PolicyAgent

from durable_rollouts.models import Task
from durable_rollouts.processes import pid_alive
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job
from durable_rollouts.workflows import TasksetRun, TasksetRunResult, child_id, workflow_id


def echo(expected: str, **args: object) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected, **args}, source=ENV_FILE)


async def test_an_errored_rollout_has_no_reward_and_never_enters_the_mean(client, task_queue, tmp_path) -> None:
    """An agent that raises: the rollout is errored with reward None (its best-effort 0.0 grade
    kept), Job.reward and the progress query average succeeded rollouts only, the export says
    reward null with the grade under `grade`."""
    ts = Taskset("keep", [echo("a"), echo("b")])
    job = await ts.run(PolicyAgent(fail_expected=["b"], fail_members=[1]), runtime=LocalRuntime(ENV_FILE),
                       group=2, temporal=client, worker=True, task_queue=task_queue)
    assert [r.status for r in job.runs] == ["succeeded", "succeeded", "succeeded", "errored"]
    bad = job.runs[3]
    assert bad.reward is None and bad.grade is not None and bad.grade_reward == 0.0
    assert job.reward == 1.0 and len(job.graded) == 3 and job.errors == [bad]
    assert job.group_stats()[bad.group_id].graded == 1
    # the batch's final progress (what its `progress` query answered last), from its result
    result = await client.get_workflow_handle(workflow_id(job.id), result_type=TasksetRunResult).result()
    progress = result.progress
    assert (progress.succeeded, progress.errored, progress.graded, progress.mean_reward) == (3, 1, 3, 1.0)
    rows = [json.loads(line) for line in job.export(tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, None]
    assert rows[3]["status"] == "errored" and rows[3]["grade"]["reward"] == 0.0
    assert rows[3]["dropped"] is False and "fails on purpose" in rows[3]["error"]


async def test_retries_rerun_an_errored_rollout_fresh_and_record_every_attempt(client, task_queue) -> None:
    """retries=2 with an agent that fails its first two runs: the rollout succeeds on a third
    Rollout child (<id>-r2, a new substrate key), keeps its stable id and records both errors."""
    ts = Taskset("retry", [echo("a")])
    job = await ts.run(PolicyAgent(fail_expected=["a"], fail_below=2), runtime=LocalRuntime(ENV_FILE),
                       retries=2, temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    rid = f"job-{job.id}-{ts.tasks[0].slug}-0"
    assert run.rollout_id == rid and run.status == "succeeded" and run.reward == 1.0
    assert run.retries == 2 and [a.workflow_id for a in run.retry_history] == [rid, f"{rid}-r1"]
    assert [a.status for a in run.retry_history] == ["errored", "errored"]
    assert all("fails on purpose" in (a.error or "") for a in run.retry_history)
    for n in range(3):  # every attempt is its own Rollout workflow with its own substrate key
        desc = await client.get_workflow_handle(child_id(rid, n)).describe()
        assert desc.status.name == "COMPLETED"
    # read back through Temporal (latest result wins): same outcome
    again = await get_job(job.id, temporal=client)
    assert again.runs[0].retries == 2 and again.runs[0].status == "succeeded"


async def test_retries_are_spent_then_the_error_stays(client, task_queue) -> None:
    """An agent that always fails: retries=1 runs it twice, then the rollout stays errored."""
    ts = Taskset("spent", [echo("a")])
    job = await ts.run(PolicyAgent(fail_expected=["a"]), runtime=LocalRuntime(ENV_FILE),
                       retries=1, temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert run.status == "errored" and run.retries == 1 and len(run.retry_history) == 1
    assert run.reward is None and job.reward is None


async def test_drop_group_leaves_a_group_with_an_unrecovered_error_out_of_the_stats(
        client, task_queue, tmp_path) -> None:
    """on_error=drop_group: every member of a group with an error left after retries is marked
    dropped, exported with dropped: true, and left out of Job.reward and group stats (also when
    the job is read back through Temporal); an error a retry recovered drops nothing."""
    ts = Taskset("drop", [echo("a"), echo("b"), echo("c")])
    # member 0 of "a" and of "c" fails its first run
    agent = PolicyAgent(fail_expected=["a", "c"], fail_members=[0], fail_below=1)
    job = await ts.run(agent, runtime=LocalRuntime(ENV_FILE), group=2, on_error="drop_group",
                       temporal=client, worker=True, task_queue=task_queue)
    gid_a, gid_b, gid_c = (job.runs[i].group_id for i in (0, 2, 4))
    assert [r.status for r in job.runs] == ["errored", "succeeded", "succeeded", "succeeded",
                                             "errored", "succeeded"]
    assert job.dropped_groups == [gid_a, gid_c]
    assert [r.dropped for r in job.runs] == [True, True, False, False, True, True]
    assert job.reward == 1.0 and [r.group_id for r in job.graded] == [gid_b, gid_b]
    stats = job.group_stats()
    assert stats[gid_a].graded == 0 and stats[gid_a].mean is None and stats[gid_b].mean == 1.0
    rows = [json.loads(x) for x in job.export(tmp_path / "d.jsonl").read_text().splitlines()]
    assert [r["dropped"] for r in rows] == [True, True, False, False, True, True]
    assert rows[1]["status"] == "succeeded" and rows[1]["reward"] == 1.0  # dropped, reward kept
    again = await get_job(job.id, temporal=client)  # the policy travels with the batch
    assert again.dropped_groups == [gid_a, gid_c] and again.reward == 1.0
    # with one retry both errors are recovered: nothing is dropped
    job2 = await ts.run(agent, runtime=LocalRuntime(ENV_FILE), group=2, retries=1, on_error="drop_group",
                        temporal=client, worker=True, task_queue=task_queue)
    assert job2.dropped_groups == [] and all(r.status == "succeeded" for r in job2.runs)
    assert [r.retries for r in job2.runs] == [1, 0, 0, 0, 1, 0] and job2.reward == 1.0


async def test_fail_cancels_the_rest_and_every_substrate_is_torn_down(client, task_queue, tmp_path) -> None:
    """on_error=fail: the first unrecovered error cancels the running rollouts (each tears its
    substrate process down) and records the unstarted ones as cancelled; the batch closes with
    RolloutsStatus=failed and failed_on naming the rollout."""
    pids = [tmp_path / f"pid{i}" for i in range(6)]
    rows = [echo("boom", pid_file=str(pids[0]))] + [echo(f"s{i}", pid_file=str(pids[i])) for i in range(1, 6)]
    ts = Taskset("fail", rows)
    job = await ts.run(PolicyAgent(fail_expected=["boom"], seconds=60), runtime=SubprocessRuntime(ENV_FILE),
                       max_concurrent=3, on_error="fail", temporal=client, worker=True, task_queue=task_queue)
    statuses = [r.status for r in job.runs]
    assert statuses[0] == "errored" and set(statuses[1:]) == {"cancelled"}
    assert all(f"on_error=fail stopped the batch after {job.runs[0].rollout_id}" in (r.error or "")
               for r in job.runs[1:])
    started = [p for p in pids if p.exists()]
    assert len(started) >= 2  # the failing one and at least one that was cut short
    assert not [p for p in started if pid_alive(int(p.read_text()))], "a substrate outlived the batch"
    desc = await client.get_workflow_handle(workflow_id(job.id)).describe()
    assert desc.typed_search_attributes is not None
    status = {p.key.name: p.value for p in desc.typed_search_attributes}["RolloutsStatus"]
    assert status == "failed"
    result = await client.get_workflow_handle_for(TasksetRun.run, workflow_id(job.id)).result()
    assert result.failed_on == job.runs[0].rollout_id and result.progress.finished == 6
    assert job.reward is None


async def test_a_bad_policy_is_a_config_error_before_anything_starts(client, task_queue) -> None:
    """on_error must be keep/drop_group/fail and retries a whole number 0..20."""
    import pytest

    from durable_rollouts.errors import ConfigError

    ts = Taskset("bad", [echo("a")])
    with pytest.raises(ConfigError, match="on_error"):
        await ts.run(PolicyAgent(), runtime=LocalRuntime(ENV_FILE), on_error="explode", temporal=client,
                     worker=True, task_queue=task_queue)
    with pytest.raises(ConfigError, match="retries"):
        await ts.run(PolicyAgent(), runtime=LocalRuntime(ENV_FILE), retries=-1, temporal=client,
                     worker=True, task_queue=task_queue)
