"""Fixtures of the training-results tests: one real dev server per session (search attributes
registered, as the embedded server does), a client and a task queue per test, and helpers to
run the real ``rollouts`` CLI and the real ``temporal`` CLI against that server.
"""

from __future__ import annotations

import pytest
from temporal_fixtures import client, dev_server, task_queue  # noqa: E402,F401  (shared fixtures)


@pytest.fixture
async def tool_job(client, task_queue):  # noqa: F811  (client is the shared fixture)
    """One succeeded durable rollout whose trace is shaped like OpenAIChatAgent's: a system
    prompt, a tool call with usage, logprobs and token ids, the tool result, a final answer."""
    from temporal_helpers import ENV_FILE
    from training_agents import ToolTraceAgent

    from durable_rollouts.models import Task
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.taskset import Taskset

    task = Task(env="counting", id="echo", args={"expected": "a"}, source=ENV_FILE)
    return await Taskset("tools", [task]).run(ToolTraceAgent(), runtime=LocalRuntime(ENV_FILE),
                                              temporal=client, worker=True, task_queue=task_queue)
