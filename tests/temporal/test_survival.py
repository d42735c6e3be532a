"""Survival: SIGKILLed workers, SIGKILLed substrates, a restarted Temporal server.

Every test uses real processes: worker processes (``python -m durable_rollouts.worker``), env
subprocesses (``SubprocessRuntime``) and the dev server. Grades and agent runs are counted on disk
by the env and the agent themselves (``counting_env.py``, ``temporal_helpers.CountingAgent``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from temporal_helpers import (
    ENV_FILE,
    CheckpointingAgent,
    CountingAgent,
    DevServer,
    async_wait_for,
    read_lines,
)

from durable_rollouts.models import Task
from durable_rollouts.processes import pid_alive
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.connection import connect_client


@pytest.fixture
def short_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent step's heartbeat timeout 5 s instead of the default 20 s, for the tests that
    count what runs again after a crash rather than how soon it does (that default has its own
    test below): a dead worker's agent step is noticed 15 s sooner."""
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")


def echo(expected: str, evidence: Path, **extra: object) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": expected, "grade_log": str(evidence / "grades.log"),
        "pid_file": str(evidence / "env.pid"), **extra})


async def _killed_at(point: str, client, task_queue: str, start_worker, evidence: Path, task: Task,
                     agent: Any, runtime: Any) -> tuple[Any, dict[str, str], Any]:
    """A one-row job on a worker armed to SIGKILL itself at ``point``, once it did: the job's
    handle, the faults (for the next worker) and the dead worker."""
    faults = {"ROLLOUTS_FAULTS": point, "ROLLOUTS_FAULTS_DIR": str(evidence)}
    first = start_worker(**faults)
    handle = await start_job(Taskset("t", [task]), agent, runtime=runtime, temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: first.proc.poll() is not None, what="worker death")
    assert first.proc.returncode == -signal.SIGKILL and (evidence / f"{point}.fired").exists()
    return handle, faults, first


async def test_worker_killed_mid_agent_another_worker_finishes_once(client, task_queue, start_worker,
                                                                     evidence: Path, short_heartbeat) -> None:
    """SIGKILL the worker while the agent runs: a second worker retries the agent on the parked
    session, the reward is right, and the env graded exactly once."""
    agents = evidence / "agents.log"
    first = start_worker()
    handle = await start_job(Taskset("t", [echo("x", evidence)]),
                             CountingAgent(answer="x", seconds=2.0, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: len(read_lines(agents)) == 1, what="agent start")
    first.kill()
    second = start_worker()
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(evidence / "grades.log")) == 1
    runs = read_lines(agents)
    assert len(runs) == 2 and runs[1].startswith(f"{second.pid} ")


@pytest.mark.parametrize("kill_after_s", [0.0, 8.0], ids=["at-once", "after-8s"])
async def test_a_dead_workers_agent_step_runs_again_within_30_s(client, task_queue, start_worker,
                                                                 evidence: Path, kill_after_s: float) -> None:
    """With the defaults (the worker watch on: one sentinel beat per worker process, and the
    agent step's own heartbeat timeout a 300 s backstop, so a waiting agent costs one heartbeat
    a minute), a SIGKILLed worker's agent step is noticed by its watch and runs again on the
    other live worker within 30 s of the kill; the env grades once. The history shows how: the
    first agent step was cancelled by the Rollout (told by the watch), not timed out. Killed at
    once or 8 s into the agent step: the sentinel's later beats still list it (temporalio's own
    throttled heartbeat once recorded empty details over them, so a worker killed more than one
    beat after its agent began left the agent to the 300 s backstop)."""
    agents = evidence / "agents.log"
    pair = {w.pid: w for w in (start_worker(), start_worker())}
    handle = await start_job(Taskset("t", [echo("x", evidence)]),
                             CountingAgent(answer="x", seconds=12.0 + kill_after_s, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: len(read_lines(agents)) == 1, what="agent start")
    await asyncio.sleep(kill_after_s)
    holder = int(read_lines(agents)[0].split()[0])
    pair[holder].kill()
    killed = time.monotonic()
    await async_wait_for(lambda: len(read_lines(agents)) == 2, timeout=45, what="agent again")
    assert time.monotonic() - killed <= 30.0
    (other,) = set(pair) - {holder}
    assert read_lines(agents)[1].startswith(f"{other} ")
    (run,) = (await asyncio.wait_for(handle.wait(), 60)).runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(evidence / "grades.log")) == 1
    history = await client.get_workflow_handle(run.rollout_id).fetch_history()
    agent_steps = [e.activity_task_scheduled_event_attributes for e in history.events
                   if e.HasField("activity_task_scheduled_event_attributes")
                   and e.activity_task_scheduled_event_attributes.activity_type.name == "rollouts.agent"]
    # the schedule after a lost worker heartbeats as without the watch (a hung worker's polls)
    assert [a.heartbeat_timeout.ToTimedelta().total_seconds() for a in agent_steps] == [300.0, 20.0]
    kinds = [e.WhichOneof("attributes") for e in history.events]
    assert "activity_task_cancel_requested_event_attributes" in kinds
    assert "activity_task_timed_out_event_attributes" not in kinds


async def test_worker_killed_after_grade_regrade_returns_cached_result(client, task_queue, start_worker,
                                                                       evidence: Path) -> None:
    """SIGKILL right after the env graded, before the result was recorded: the retried grade gets
    the cached result; the env graded exactly once."""
    faults = {"ROLLOUTS_FAULTS": "after_grade", "ROLLOUTS_FAULTS_DIR": str(evidence)}
    first = start_worker(**faults)
    handle = await start_job(Taskset("t", [echo("x", evidence)]), CountingAgent(answer="x"),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: (evidence / "after_grade.fired").exists(), what="fault")
    await async_wait_for(lambda: first.proc.poll() is not None, what="worker death")
    assert first.proc.returncode == -signal.SIGKILL
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    assert len(read_lines(evidence / "grades.log")) == 1


async def test_worker_killed_after_start_before_its_task_completed_starts_the_task_once(
        client, task_queue, start_worker, evidence: Path) -> None:
    """SIGKILL right after the start step returned: connect and start ran as local activities in
    one workflow task, which never completed. The next worker replays connect (a new session) and
    start; the start is keyed by run and substrate (``tasks.start`` ``start_key``), so the env
    hands back the task it already started, in its first session, instead of running the task's
    setup again (which it did before: two starts in one env process). One attempt, one setup,
    the agent once, one grade."""
    agents = evidence / "agents.log"
    handle, faults, _ = await _killed_at("after_start", client, task_queue, start_worker, evidence,
                                         echo("x", evidence, start_log=str(evidence / "starts.log")),
                                         CountingAgent(answer="x", log=str(agents)), SubprocessRuntime(ENV_FILE))
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(evidence / "starts.log")) == 1
    assert len(read_lines(evidence / "grades.log")) == 1
    assert len(read_lines(agents)) == 1


async def test_worker_killed_after_teardown_before_its_task_completed_grades_once_and_runs_the_agent_once(
        client, task_queue, start_worker, evidence: Path) -> None:
    """SIGKILL right after teardown returned: grade and teardown ran as local activities in one
    workflow task, which never completed, so the history has neither. The next worker replays the
    grade against the torn-down env; the grade step's receipt (``stores.grade_receipts``) answers
    with the first grade, so the rollout does not run again: one attempt, the agent once, one
    grade. Before receipts the replayed grade took the torn-down env for a dead substrate and
    the rollout ran again from provision (agent and grade twice)."""
    agents = evidence / "agents.log"
    handle, faults, _ = await _killed_at("after_teardown", client, task_queue, start_worker, evidence,
                                         echo("x", evidence), CountingAgent(answer="x", log=str(agents)),
                                         SubprocessRuntime(ENV_FILE))
    pid = int((evidence / "env.pid").read_text())
    await async_wait_for(lambda: not pid_alive(pid), what="the torn-down env's exit")
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(evidence / "grades.log")) == 1
    assert len(read_lines(agents)) == 1


@pytest.mark.parametrize("second_host", [False, True], ids=["same-host", "another-host"])
async def test_worker_killed_after_an_in_process_grade_keeps_the_grade_on_its_host(
        client, task_queue, start_worker, evidence: Path, monkeypatch, second_host: bool) -> None:
    """An in-process substrate lives in the worker that provisioned it and dies with it. SIGKILL
    right after the env graded, before the grade is recorded: the grade step on the next worker
    finds the substrate gone.

    - On the same host it finds the first grade's receipt (``stores.grade_receipts``): the
      rollout ends with that grade, one attempt, the agent once, one grade.
    - On another host (here: another ``ROLLOUTS_HOME``) there is no receipt: the rollout runs
      again on a fresh substrate in the live worker, graded once per substrate, never twice on
      one, and the result records the lost attempt.
    """
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")
    agents = evidence / "agents.log"
    handle, faults, first = await _killed_at("after_grade", client, task_queue, start_worker, evidence,
                                             echo("x", evidence), CountingAgent(answer="x", log=str(agents)),
                                             LocalRuntime(ENV_FILE))
    home: dict[str, str] = {}
    if second_host:
        (evidence / "another-host").mkdir()
        home["ROLLOUTS_HOME"] = str(evidence / "another-host")
    second = start_worker(**faults, **home)
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    grades = read_lines(evidence / "grades.log")  # "<tag> <env pid> <answer>": the env is in the worker
    ran = [line.split()[0] for line in read_lines(agents)]
    if not second_host:
        assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
        assert [line.split()[-2] for line in grades] == [str(first.pid)], grades
        assert ran == [str(first.pid)]
        return
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    assert "attempt 1 (grading)" in (run.error or ""), run.error
    assert [line.split()[-2] for line in grades] == [str(first.pid), str(second.pid)], grades
    assert ran == [str(first.pid), str(second.pid)]


async def test_worker_killed_mid_agent_holding_an_in_process_substrate_reprovisions_elsewhere(
        client, task_queue, start_worker, evidence: Path, monkeypatch, short_heartbeat) -> None:
    """SIGKILL the worker holding an in-process substrate right after the agent's first
    checkpoint (a turn whose side effect is logged): the agent step's retry waits on the dead
    worker's queue, which nobody polls, so the substrate counts as gone and attempt 2 runs from
    the start on a new substrate in the live worker. Every turn and every grade is counted:
    nothing is lost, nothing graded twice, the lost attempt is recorded."""
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")
    faults = {"ROLLOUTS_FAULTS": "after_checkpoint", "ROLLOUTS_FAULTS_DIR": str(evidence)}
    turns = evidence / "turns.log"
    first = start_worker(**faults)
    handle = await start_job(Taskset("t", [echo("x", evidence)]), CheckpointingAgent(log=str(turns)),
                             runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: first.proc.poll() is not None, what="worker death")
    assert first.proc.returncode == -signal.SIGKILL
    second = start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 90)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    assert "attempt 1 (agent loop)" in (run.error or ""), run.error
    rows = [line.split() for line in read_lines(turns)]
    assert [(pid, turn) for pid, _, turn in rows] == [
        (str(first.pid), "1"), (str(second.pid), "1"), (str(second.pid), "2"), (str(second.pid), "3")]
    assert len({session for _, session, _ in rows[1:]}) == 1 and rows[0][1] != rows[1][1]
    grades = read_lines(evidence / "grades.log")
    assert [line.split()[-2] for line in grades] == [str(second.pid)], grades


async def test_substrate_killed_mid_agent_reprovisions_and_records_attempts(client, task_queue,
                                                                            evidence: Path) -> None:
    """SIGKILL the env subprocess while the agent runs: the rollout reprovisions and restarts;
    attempts == 2 is recorded and the reward is right."""
    agents = evidence / "agents.log"
    handle = await start_job(Taskset("t", [echo("x", evidence)]),
                             CountingAgent(answer="x", seconds=1.5, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=True,
                             task_queue=task_queue)
    pid_file = evidence / "env.pid"
    await async_wait_for(lambda: len(read_lines(agents)) == 1 and pid_file.exists(), what="agent start")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    assert "attempt 1" in (run.error or "")
    assert len(read_lines(agents)) == 2 and len(read_lines(evidence / "grades.log")) == 1


async def test_verifier_substrate_killed_only_verifier_reruns(client, task_queue, evidence: Path) -> None:
    """SIGKILL the verifier's substrate mid-verify: only the verifier runs again, never the agent."""
    agents = evidence / "agents.log"
    vlog, vpid = evidence / "referee.log", evidence / "referee.pid"
    verifier = Task(env="referee", id="referee", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(vlog), "pid_file": str(vpid), "delay": 1.5})
    task = echo("x", evidence).model_copy(update={"verifier": verifier})
    handle = await start_job(Taskset("t", [task]), CountingAgent(answer="x", log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=True,
                             task_queue=task_queue)
    await async_wait_for(vpid.exists, what="verifier grading")
    os.kill(int(vpid.read_text()), signal.SIGKILL)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(agents)) == 1
    assert len(read_lines(evidence / "grades.log")) == 1 and len(read_lines(vlog)) == 1


async def test_batch_survives_temporal_server_restart(tmp_path: Path, task_queue, evidence: Path) -> None:
    """Stop the dev server mid-batch and restart it on the same sqlite file: the batch completes."""
    from temporal_helpers import WorkerProcess

    server = DevServer(tmp_path / "restart.db")
    server.start()
    worker = None
    try:
        client = await connect_client(server.address)
        worker = WorkerProcess(server.address, task_queue)
        rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
                for i in range(4)]
        handle = await start_job(Taskset("t", rows), CountingAgent(answer="x", seconds=1.5),
                                 runtime=LocalRuntime(ENV_FILE), max_concurrent=2, temporal=client,
                                 worker=False, task_queue=task_queue)
        for _ in range(100):
            if (await handle.progress()).running:
                break
            await asyncio.sleep(0.1)
        server.stop()
        await asyncio.sleep(1.0)
        server.start()
        client = await connect_client(server.address)
        handle.handle = client.get_workflow_handle(handle.workflow_id, result_type=handle.handle._result_type)
        job = await asyncio.wait_for(handle.wait(), 90)
        assert [r.reward for r in job.runs] == [1.0] * 4, [r.error for r in job.runs]
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


pytestmark = pytest.mark.timeout(120)


async def test_cancelled_batch_tears_substrates_down(client, task_queue, evidence: Path) -> None:
    """Cancelling a running batch cancels the agent and still runs teardown: no substrate leaks."""
    agents = evidence / "agents.log"
    handle = await start_job(Taskset("t", [echo("x", evidence)]),
                             CountingAgent(answer="x", seconds=60, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=True,
                             task_queue=task_queue)
    pid_file = evidence / "env.pid"
    await async_wait_for(lambda: len(read_lines(agents)) == 1 and pid_file.exists(), what="agent start")
    pid = int(pid_file.read_text())
    await handle.cancel()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await async_wait_for(gone, timeout=20, what="substrate teardown")
    with pytest.raises(Exception):
        await asyncio.wait_for(handle.handle.result(), 20)
    assert not read_lines(evidence / "grades.log")


async def test_rollout_timeout_cancels_agent_and_tears_down(client, task_queue, evidence: Path) -> None:
    """A rollout over its timeout ends as ``timeout`` (a durable timer), and its substrate is removed."""
    agents = evidence / "agents.log"
    handle = await start_job(Taskset("t", [echo("x", evidence)]),
                             CountingAgent(answer="x", seconds=60, log=str(agents)),
                             runtime=SubprocessRuntime(ENV_FILE), rollout_timeout=2.0, temporal=client,
                             worker=True, task_queue=task_queue)
    job = await asyncio.wait_for(handle.wait(), 30)
    (run,) = job.runs
    assert (run.status, run.error_phase, run.reward) == ("timeout", "agent loop", None), run.error
    pid = int((evidence / "env.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_worker_killed_after_provision_next_worker_replays_and_finishes(
        client, task_queue, start_worker, evidence: Path) -> None:
    """SIGKILL right after provision (a local activity here), before the workflow task completed:
    the next worker replays the Rollout without nondeterminism, reuses the substrate, finishes."""
    faults = {"ROLLOUTS_FAULTS": "after_provision", "ROLLOUTS_FAULTS_DIR": str(evidence)}
    first = start_worker(**faults)
    handle = await start_job(Taskset("t", [echo("x", evidence)]), CountingAgent(answer="x"),
                             runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=False,
                             task_queue=task_queue)
    await async_wait_for(lambda: first.proc.poll() is not None, what="worker death")
    start_worker(**faults)
    job = await asyncio.wait_for(handle.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
    assert len(read_lines(evidence / "grades.log")) == 1
