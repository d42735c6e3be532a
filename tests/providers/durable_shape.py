"""Run a small durable batch on a runtime and read the card's steps from each Rollout's history.

Used by every provider's test module to prove the same contract: whatever the runtime, a
Rollout records provision, connect, start, agent, grade, teardown as separately named steps,
and its agent step heartbeats. A real dev server per call, an in-process worker (so stand-ins
monkeypatched into this process serve the provider's SDK calls).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from history_scan import step_names
from temporal_helpers import DevServer

from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import shutdown_embedded
from durable_rollouts.temporal.connection import connect_client
from durable_rollouts.settings import AGENT_HEARTBEAT_WATCHED_S

CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]


def _agent_heartbeat(history: Any) -> float | None:
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "rollouts.agent":
                return attrs.heartbeat_timeout.ToTimedelta().total_seconds()
    return None


async def durable_shapes(runtime: Any, tasks: list[Any], agent: Any, folder: Path) -> tuple[Job, list[list[str]]]:
    """Run ``tasks`` once each on ``runtime`` through Temporal; the job and each Rollout's steps.

    Also asserts that every agent step was scheduled with a heartbeat timeout."""
    server = DevServer(folder / "temporal-shape.db")
    server.start()
    try:
        client = await connect_client(server.address)
        job = await Taskset("shape", tasks).run(agent, runtime=runtime, temporal=client, worker=True,
                                                task_queue=f"shape-{uuid.uuid4().hex[:8]}")
        shapes = []
        for run in job.runs:
            history = await client.get_workflow_handle(run.rollout_id).fetch_history()
            assert _agent_heartbeat(history) == AGENT_HEARTBEAT_WATCHED_S
            shapes.append(step_names(history))
        return job, shapes
    finally:
        await shutdown_embedded()
        server.stop()
