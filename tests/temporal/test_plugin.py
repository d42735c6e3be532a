"""RolloutsPlugin: a user's own temporalio Client and Worker run durable rollouts."""

from __future__ import annotations

import uuid

from temporal_helpers import ENV_FILE
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from durable_rollouts.activities import Queues
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.plugin import RolloutsPlugin
from durable_rollouts.worker import build_worker, worker_parts


async def test_a_plain_worker_with_the_plugin_runs_and_grades_a_batch(dev_server) -> None:
    """Client.connect(plugins=[RolloutsPlugin()]) + a bare Worker on that client is a complete
    rollouts worker: the batch runs, every rollout is graded, and payloads decode as models."""
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(dev_server.address, plugins=[RolloutsPlugin(task_queue=queue)])
    tasks = [Task(env="counting", id="echo", args={"expected": e}, source=ENV_FILE) for e in "ab"]
    async with Worker(client, task_queue=queue):
        job = await Taskset("plugged", tasks).run(
            FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
            temporal=client, task_queue=queue, worker=False)
    assert [r.status for r in job.runs] == ["succeeded"] * 4
    assert [r.reward for r in job.runs] == [1.0, 1.0, 0.0, 0.0]


def _registered(worker: Worker) -> tuple[list[str], list[str], list[str]]:
    """Workflow names, activity names and interceptor types a temporalio Worker was configured with."""
    config = worker.config(active_config=True)
    return (sorted(workflow._Definition.must_from_class(w).name for w in config.get("workflows") or []),
            sorted(activity._Definition.must_from_callable(a).name
                   for a in config.get("activities") or []),
            [type(i).__name__ for i in config.get("interceptors") or []])


async def test_the_plugin_and_the_packaged_worker_register_the_same_parts(dev_server) -> None:
    """One list (``worker.worker_parts``): a bare Worker with the plugin and ``build_worker``'s
    shared-queue Worker register the same workflows, activities and interceptors."""
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    plugged = await Client.connect(dev_server.address, plugins=[RolloutsPlugin(task_queue=queue)])
    packaged = build_worker(await Client.connect(dev_server.address), task_queue=queue)
    workflows, activities, interceptors = _registered(Worker(plugged, task_queue=queue))
    assert (workflows, activities, interceptors) == _registered(packaged.workers[0])
    assert workflows == ["Rollout", "RolloutsAdmission", "TasksetRun", "WorkerWatch"] and "OwnerInterceptor" in interceptors
    assert len(activities) == len(worker_parts(Queues(shared=queue)).activities) > 5
