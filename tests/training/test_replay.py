"""The new workflow paths replay deterministically: the histories of batches that retried
rollouts (children ``-r<n>``), stopped on ``on_error=fail`` and upserted the Rollout search
attributes replay without nondeterminism on the same code."""

from __future__ import annotations

from temporal_helpers import ENV_FILE
from temporalio.worker import Replayer
from training_agents import PolicyAgent

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun, child_id, workflow_id


def echo(expected: str) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected}, source=ENV_FILE)


async def test_retry_and_fail_histories_replay(client, task_queue) -> None:
    """Every workflow of a retrying batch and of a batch stopped by on_error=fail replays."""
    retried = await Taskset("r", [echo("a"), echo("b")]).run(
        PolicyAgent(fail_expected=["a"], fail_below=1), runtime=LocalRuntime(ENV_FILE), group=2, retries=1,
        temporal=client, worker=True, task_queue=task_queue)
    failed = await Taskset("f", [echo("a"), echo("b"), echo("c")]).run(
        PolicyAgent(fail_expected=["a"]), runtime=LocalRuntime(ENV_FILE), max_concurrent=1, on_error="fail",
        temporal=client, worker=True, task_queue=task_queue)
    ids = [workflow_id(retried.id), workflow_id(failed.id)]
    ids += [child_id(r.rollout_id, n) for r in retried.runs for n in range(r.retries + 1)]
    ids += [r.rollout_id for r in failed.runs if r.attempts]  # the started ones
    assert len(ids) == 2 + 6 + 1
    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    for wid in ids:
        history = await client.get_workflow_handle(wid).fetch_history()
        await replayer.replay_workflow(history)
