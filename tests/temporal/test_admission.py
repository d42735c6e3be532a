"""Fleet-wide admission: a creation rate and a ceiling on live substrates, held across workers.

Three real worker processes share one task queue; the runtime allows 2 provisions per second and
5 live substrates. The rate is read back from the server's own record (the provision activities'
start times in each Rollout's history), the ceiling from the provider's own log of creates and
removals (``admission_provider.LiveCounter``), so neither trusts the admission code's view.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from admission_provider import LiveCounter, max_live
from temporal_helpers import ENV_FILE, CountingAgent, wait_for
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Replayer

from durable_rollouts.admission import admission_workflow_id
from durable_rollouts.models import Task
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.jobs import load_job
from durable_rollouts.workflows import Rollout, TasksetRun, rollout_id, workflow_id
from durable_rollouts.workflows.admission import AdmissionWorkflow

ROWS, GROUP = 10, 4  # 40 rollouts


@pytest.fixture
def env_url(tmp_path: Path) -> Iterator[str]:
    """One env server every substrate of the test provider points at."""
    log = tmp_path / "env.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "durable_rollouts.envserver", ENV_FILE,
                                 "--env", "counting", "--port", "0"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "ROLLOUTS_SERVE_PORT=" in log.read_text() or proc.poll() is not None,
                 what="env server")
        found = re.search(r"ROLLOUTS_SERVE_PORT=(\d+)", log.read_text())
        assert found, log.read_text()
        yield f"tcp://127.0.0.1:{found.group(1)}"
    finally:
        proc.terminate()
        proc.wait(10)


def most_in_window(times: list[float], window_s: float = 1.0) -> int:
    """The most events in any closed window of ``window_s`` seconds."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u <= t + window_s) for i, t in enumerate(times)), default=0)


async def provision_starts(client: Client, workflow_id: str) -> list[float]:
    """When the server started each provision activity of a Rollout (its history's record)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    provisions = {e.event_id for e in history.events
                  if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                  and e.activity_task_scheduled_event_attributes.activity_type.name == "rollouts.provision"}
    return [e.event_time.ToDatetime().timestamp() for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in provisions]


async def test_three_workers_hold_two_provisions_per_second_and_five_live_substrates(
        client, task_queue, start_worker, evidence: Path, env_url: str) -> None:
    """40 rollouts on 3 workers with max_provisions_per_s=2, max_substrates=5: no 1-second window
    of the server's provision start times holds more than 2, the provider never has more than 5
    alive (and reaches 5), waiting rollouts say so (phase, status, ``rollouts show``), and a
    wait longer than the rollout timeout does not time the rollout out."""
    workers = [start_worker() for _ in range(3)]
    live_log = evidence / "live.log"
    runtime = LiveCounter(env_url, str(live_log), create_s=0.2, max_provisions_per_s=2, max_substrates=5)
    rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
            for i in range(ROWS)]
    timeout_s = 8.0
    handle = await start_job(Taskset("admission", rows), CountingAgent(answer="x", seconds=2.0),
                             runtime=runtime, temporal=client, worker=False, task_queue=task_queue,
                             group=GROUP, max_concurrent=ROWS * GROUP, rollout_timeout=timeout_s)
    job_id = handle.job.id
    ids = [rollout_id(job_id, row.slug, gi) for row in rows for gi in range(GROUP)]

    # the last rollout waits: its phase and RolloutsStatus say so, and so does `rollouts show`
    last = client.get_workflow_handle(ids[-1])
    phase: dict[str, object] = {}
    for _ in range(100):
        try:
            phase = await last.query("phase")
        except Exception:  # not started yet
            phase = {}
        if phase.get("phase") == "waiting for admission":
            break
        await asyncio.sleep(0.1)
    assert phase.get("phase") == "waiting for admission", phase
    details = await last.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "waiting for admission" in details.current_details, details  # the Web UI shows it
    shown = await load_job(client, job_id)
    assert "waiting" in {r.status for r in shown.runs}, sorted({r.status for r in shown.runs})

    job = await asyncio.wait_for(handle.wait(), 240)
    assert [r.status for r in job.runs] == ["succeeded"] * (ROWS * GROUP), \
        [(r.rollout_id, r.status, r.error) for r in job.runs if r.status != "succeeded"]
    # some rollout waited for admission longer than its rollout timeout and still succeeded
    descs = [await client.get_workflow_handle(wid).describe() for wid in ids]
    longest = max((d.close_time - d.start_time).total_seconds() for d in descs)
    assert longest > timeout_s, longest

    starts = [t for wid in ids for t in await provision_starts(client, wid)]
    assert len(starts) == ROWS * GROUP
    window = most_in_window(starts)
    most, left = max_live(live_log)
    creators = {line.split()[2] for line in live_log.read_text().splitlines() if line.startswith("+")}
    print(f"\nadmission: {len(starts)} provisions in {max(starts) - min(starts):.1f} s; most starts "
          f"in 1 s: {window}; most live substrates: {most}; left: {left}; "
          f"creating workers: {len(creators)} of {len(workers)}; longest rollout {longest:.1f} s "
          f"(timeout {timeout_s} s)")
    assert window == 2  # the rate binds, and holds
    assert most == 5 and left == 0  # the ceiling binds, and holds
    assert len(creators) >= 2  # fleet-wide: more than one worker created substrates

    # the new path replays deterministically: a batch, a rollout that waited, the admission workflow
    replayer = Replayer(workflows=[TasksetRun, Rollout, AdmissionWorkflow], data_converter=data_converter())
    for wid in (workflow_id(job_id), ids[-1], admission_workflow_id(task_queue, runtime.kind)):
        await replayer.replay_workflow(await client.get_workflow_handle(wid).fetch_history())

