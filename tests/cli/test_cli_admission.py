"""`rollouts run --max-provisions-per-s/--max-substrates` end to end on the embedded server: the
batch runs under the admission workflow of its queue and runtime, and every rollout succeeds."""

from __future__ import annotations

import asyncio
import json

from cli_helpers import ANSWERS, LETTERS, rollouts
from temporalio.api.enums.v1 import EventType

from durable_rollouts.admission import admission_workflow_id
from durable_rollouts.temporal.connection import connect_client


def test_run_with_admission_options_succeeds_under_the_admission_workflow(embedded_server) -> None:
    queue = "cli-admission"
    result = rollouts("run", str(LETTERS), "--agent", "table", "--agent-config",
                      json.dumps({"answers": ANSWERS}), "--runtime", "subprocess", "--group", "2",
                      "--max-substrates", "2", "--max-provisions-per-s", "4", "--task-queue", queue,
                      "-o", "-", timeout=120)
    assert result.code == 0, result.err
    runs = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert len(runs) == 8 and all(r["status"] == "succeeded" for r in runs), result.out

    async def signals() -> dict[str, int]:  # no worker polls the queue any more: read history
        client = await connect_client(embedded_server.address)
        history = await client.get_workflow_handle(admission_workflow_id(queue, "subprocess")).fetch_history()
        counts: dict[str, int] = {}
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                name = event.workflow_execution_signaled_event_attributes.signal_name
                counts[name] = counts.get(name, 0) + 1
        return counts

    # every rollout asked once, reported its provision's start and gave its ticket back
    assert asyncio.run(signals()) == {"acquire": 8, "provision_started": 8, "release": 8}
