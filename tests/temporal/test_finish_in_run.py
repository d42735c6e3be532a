"""A batch with nothing left to start finishes in its run when the server suggests continue-as-new.

The server here suggests continue-as-new past ``SUGGEST`` history events
(``limit.historyCount.suggestContinueAsNew``), far sooner than a batch's own
``max_history_events``. A batch whose rows have all started and whose rollouts still run then
finishes in its run (``workflow.patched("finish-in-run")``): a continue-as-new there only raced
the rollouts' ends (each end that arrived while the command was in flight failed the workflow
task). A batch with rows still to start continues as new as before.
"""

from __future__ import annotations

import os
import time

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, DevServer, configured_server
from temporalio.worker import Replayer

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.connection import connect_client
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id

SUGGEST = 30  # limit.historyCount.suggestContinueAsNew on this test's server


@pytest.fixture(scope="module")
def suggesting_server(tmp_path_factory: pytest.TempPathFactory):
    with configured_server(tmp_path_factory.mktemp("suggest"),
                           {"limit.historyCount.suggestContinueAsNew": SUGGEST}) as server:
        yield server


async def _run(server: DevServer, rows: int, width: int):  # type: ignore[no-untyped-def]
    """``rows`` one-row tasks at ``max_concurrent=width``: the first half end after 0.2 s, the
    rest after 3 s (so some end while the others run). Returns the job and its batch's runs'
    histories, oldest first."""
    client = await connect_client(server.address)
    taskset = Taskset("finish", [Task(env="counting", id="echo", source=ENV_FILE,
                                      args={"expected": "x", "tag": f"row{i}"}) for i in range(rows)])
    agent = CountingAgent(answer="x", seconds=0.2, slow_tags=[f"row{i}" for i in range(rows // 2, rows)],
                          slow_seconds=3.0)
    job = await taskset.run(agent, runtime=LocalRuntime(ENV_FILE), max_concurrent=width, temporal=client,
                            worker=True, task_queue=f"finish-{os.getpid()}-{time.monotonic_ns()}")
    runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{workflow_id(job.id)}'")]
    runs.sort(key=lambda wf: wf.start_time)
    histories = [await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history() for wf in runs]
    return job, histories


def _kinds(history) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.WhichOneof("attributes") for e in history.events]


async def test_a_batch_with_nothing_left_to_start_finishes_in_its_run(suggesting_server) -> None:
    job, histories = await _run(suggesting_server, rows=12, width=12)
    assert len(job.runs) == 12 and {r.status for r in job.runs} == {"succeeded"}
    assert len(histories) == 1, [len(h.events) for h in histories]  # no continue-as-new
    kinds = _kinds(histories[0])
    assert len(kinds) > SUGGEST  # the server suggested continuing as new while rollouts ran
    assert "workflow_task_failed_event_attributes" not in kinds
    assert b"finish-in-run" in b"".join(e.SerializeToString() for e in histories[0].events)
    # The run replays on this release's code, taking the same branch (deterministic).
    await Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter()).replay_workflow(histories[0])


async def test_a_batch_with_rows_left_still_continues_as_new(suggesting_server) -> None:
    job, histories = await _run(suggesting_server, rows=16, width=4)
    assert len(job.runs) == 16 and {r.status for r in job.runs} == {"succeeded"}
    assert len(histories) >= 2  # continued as new while rows were left to start
    assert _kinds(histories[0])[-1] == "workflow_execution_continued_as_new_event_attributes"
    assert sorted(r.rollout_id for r in job.runs) == sorted({r.rollout_id for r in job.runs})
