"""Fleet-wide admission: a creation rate and a ceiling on live substrates, held across workers.

Three real worker processes share one task queue; the runtime allows 2 provisions per second and
5 live substrates. The rate is read back from the server's own record (the provision activities'
start times in each Rollout's history), the ceiling from the provider's own log of creates and
removals (``admission_provider.LiveCounter``), so neither trusts the admission code's view.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
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
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.jobs import load_job
from durable_rollouts.workflows import Rollout, TasksetRun, rollout_id, workflow_id
from durable_rollouts.workflows.admission import AdmissionState, AdmissionWorkflow

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

    # a rollout that waits says so in its phase and its Web UI details (read while it waits:
    # which rollouts ask first, and so wait least, is up to the workers), as RolloutsStatus and
    # `rollouts show` do below
    seen: tuple[str, str] | None = None
    deadline = time.monotonic() + 30
    while seen is None and time.monotonic() < deadline:
        for wid in reversed(ids):
            handle_ = client.get_workflow_handle(wid)
            try:
                phase = (await handle_.query("phase")).get("phase")
                if phase != "waiting for admission":
                    continue
                meta = await handle_.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            except Exception:  # not started yet
                continue
            if "waiting for admission" in meta.current_details:  # still waiting when read
                seen = (wid, meta.current_details)
                break
        await asyncio.sleep(0.1)
    assert seen is not None, "no rollout showed it waits for admission"  # the Web UI shows it
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



async def _admission_state(client: Client, task_queue: str, kind: str) -> AdmissionState:
    handle = client.get_workflow_handle(admission_workflow_id(task_queue, kind))
    return await handle.query("state", result_type=AdmissionState)


async def test_a_cancelled_batch_leaves_no_ticket_held_or_waiting(
        client, task_queue, evidence: Path, env_url: str) -> None:
    """Cancel a batch while one rollout holds the only ticket and two wait: every rollout ends
    cancelled, teardown ran for the one that provisioned, and the admission workflow holds and
    queues nothing for them any more."""
    live_log = evidence / "live.log"
    runtime = LiveCounter(env_url, str(live_log), max_substrates=1)
    rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
            for i in range(3)]
    agents = evidence / "agents.log"
    handle = await start_job(Taskset("cancel", rows),
                             CountingAgent(answer="x", seconds=30.0, log=str(agents)),
                             runtime=runtime, temporal=client, worker=True, task_queue=task_queue,
                             max_concurrent=3)
    for _ in range(200):  # the holder's agent runs (a cancelled create is another matter: #41 item 2)
        if agents.exists() and agents.read_text():
            break
        await asyncio.sleep(0.05)

    async def two_waiting() -> bool:
        try:
            state = await _admission_state(client, task_queue, runtime.kind)
        except Exception:
            return False
        return len(state.holders) == 1 and len(state.waiting) == 2

    for _ in range(200):
        if await two_waiting():
            break
        await asyncio.sleep(0.1)
    assert await two_waiting()
    await handle.cancel()
    for _ in range(200):
        state = await _admission_state(client, task_queue, runtime.kind)
        if not state.holders and not state.waiting:
            break
        await asyncio.sleep(0.1)
    assert not state.holders and not state.waiting, state
    most, left = max_live(live_log)
    assert (most, left) == (1, 0)
    await handle.release()


@pytest.mark.timeout(90)
async def test_a_terminated_holder_gives_its_ticket_back_through_the_sweep(
        client, task_queue, evidence: Path, env_url: str, monkeypatch) -> None:
    """A Rollout terminated while it holds the only ticket cannot give it back; the admission
    workflow's sweep finds it closed and the next rollout is admitted."""
    monkeypatch.setenv("ROLLOUTS_ADMISSION_SWEEP", "1")  # read as the runtime is made
    runtime = LiveCounter(env_url, str(evidence / "live.log"), create_s=0.0, max_substrates=1)
    rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
            for i in range(2)]
    handle = await start_job(Taskset("sweep", rows), CountingAgent(answer="x", seconds=1.0),
                             runtime=runtime, temporal=client, worker=True, task_queue=task_queue,
                             max_concurrent=2)
    state = AdmissionState()
    for _ in range(200):
        with contextlib.suppress(Exception):
            state = await _admission_state(client, task_queue, runtime.kind)
        if state.holders and state.waiting:
            break
        await asyncio.sleep(0.05)
    (holder,) = state.holders.values()
    assert state.limits.sweep_s == 1.0  # the setting reached the admission workflow
    await client.get_workflow_handle(holder).terminate("test: a holder that never gives back")
    job = await asyncio.wait_for(handle.wait(), 60)  # the sweep runs every second here
    statuses = sorted(r.status for r in job.runs)
    assert "succeeded" in statuses, [(r.rollout_id, r.status, r.error) for r in job.runs]


async def test_an_in_process_runtime_takes_admission_too(client, task_queue) -> None:
    """LocalRuntime (the substrate lives in the worker process) under a ceiling of 1: every
    rollout succeeds, one at a time, and each gave its ticket back."""
    rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
            for i in range(4)]
    runtime = LocalRuntime(ENV_FILE, max_substrates=1, max_provisions_per_s=10)
    started = time.monotonic()
    job = await Taskset("local", rows).run(CountingAgent(answer="x"), runtime=runtime,
                                           temporal=client, worker=True, task_queue=task_queue,
                                           max_concurrent=4)
    assert [r.status for r in job.runs] == ["succeeded"] * 4
    history = await client.get_workflow_handle(admission_workflow_id(task_queue, runtime.kind)).fetch_history()
    released = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                and e.workflow_execution_signaled_event_attributes.signal_name == "release"]
    assert len(released) == 4  # the in-process worker is gone: its history, not a query
    print(f"4 admitted in-process rollouts in {time.monotonic() - started:.1f} s")
