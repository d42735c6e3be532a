"""RolloutsPlugin: a user's own temporalio Client and Worker run durable rollouts."""

from __future__ import annotations

import uuid

from temporal_helpers import ENV_FILE
from temporalio.client import Client
from temporalio.worker import Worker

from durable_rollouts.models import Task
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.providers import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.plugin import RolloutsPlugin


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
