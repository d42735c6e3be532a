"""The worker's background gc sweep (``--gc-every``): leaked substrates go without ``rollouts gc``.

Real parts throughout: worker processes (``python -m durable_rollouts.worker`` and ``rollouts
worker``), env servers placed by ``SubprocessRuntime`` and workflows on the session's dev server.
An orphan is a substrate placed under the key of a terminated workflow (as in the docker gc
test), or under a key no server knows by a process that has exited since.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, WorkerProcess, async_wait_for, read_lines
from temporalio.common import RetryPolicy

from durable_rollouts import gc
from durable_rollouts.gc import orphans as gc_orphans
from durable_rollouts.models import Endpoint, Task
from durable_rollouts.processes import pid_alive
from durable_rollouts.runtimes import SubprocessRuntime
from durable_rollouts.runtimes.subprocess import substrate_dir
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

RUNTIME = SubprocessRuntime(ENV_FILE)
PLACE_AND_EXIT = """
import asyncio, os, sys
from durable_rollouts.models import Task
from durable_rollouts.runtimes import SubprocessRuntime
task = Task(env="counting", id="echo", source=sys.argv[1])
endpoint = asyncio.run(SubprocessRuntime(sys.argv[1]).acquire(task, sys.argv[2]))
print(endpoint.handle["pid"], flush=True)
os._exit(0)  # leak it: no release, the env server outlives its owner
"""


def echo(evidence: Path) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(evidence / "grades.log"),
        "pid_file": str(evidence / "env.pid")})


def new_key() -> str:
    return f"job-gc{uuid.uuid4().hex[:8]}-echo-0"


async def closed_workflow(client) -> str:
    """The id of a Rollout-like workflow that has closed (terminated; nobody executes it)."""
    workflow_id = new_key()
    handle = await client.start_workflow("NoSuchWorkflow", id=workflow_id,
                                         task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
                                         retry_policy=RetryPolicy(maximum_attempts=1))
    await handle.terminate("test")
    return workflow_id


async def place(key: str) -> Endpoint:
    """A real env server under ``key``, owned by this (live) test process."""
    return await RUNTIME.acquire(Task(env="counting", id="echo", source=ENV_FILE), key)


def place_and_exit(key: str) -> int:
    """A real env server under ``key`` whose owner process has exited; returns its pid."""
    out = subprocess.run([sys.executable, "-c", PLACE_AND_EXIT, ENV_FILE, key], check=True,
                         capture_output=True, text=True, timeout=60)
    return int(out.stdout.split()[-1])


def gone(key: str, pid: int) -> bool:
    return not substrate_dir(key).exists() and not pid_alive(pid)


def start_cli_worker(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``rollouts worker ARGS`` (INFO logging) writing to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "durable_rollouts.cli", "worker", *args], stdout=out,
            stderr=subprocess.STDOUT, env=dict(os.environ, ROLLOUTS_LOG_LEVEL="INFO"),
            start_new_session=True)


async def release(*endpoints: Endpoint) -> None:
    for endpoint in endpoints:
        await RUNTIME.release(endpoint)


async def test_worker_sweep_reaps_orphans_and_spares_a_running_rollout(
        client, dev_server, task_queue, workers, evidence: Path) -> None:
    """With --gc-every 1 the worker removes the substrates of a terminated workflow and of an
    unknown workflow whose owner exited, also while a slow agent runs; the running rollout's
    substrate and an unknown workflow's substrate with a live owner are left alone."""
    closed_key = f"{await closed_workflow(client)}-a2"
    closed = await place(closed_key)
    leaked_key = new_key()  # no server knows it, and its owner is gone
    leaked_pid = await asyncio.to_thread(place_and_exit, leaked_key)
    kept = await place(new_key())  # no server knows it, but its owner (this process) lives
    agents = evidence / "agents.log"
    handle = await start_job(Taskset("t", [echo(evidence)]),
                             CountingAgent(answer="x", seconds=10.0, log=str(agents)),
                             runtime=RUNTIME, temporal=client, worker=False, task_queue=task_queue)
    late: Endpoint | None = None
    worker = WorkerProcess(dev_server.address, task_queue, env={"ROLLOUTS_LOG_LEVEL": "INFO"},
                           gc_every=1)
    workers.append(worker)
    try:
        await async_wait_for(lambda: gone(closed_key, closed.handle["pid"])
                             and gone(leaked_key, leaked_pid), timeout=20, what="the first sweeps")
        await async_wait_for(lambda: len(read_lines(agents)) == 1, timeout=30, what="agent start")
        late_key = await closed_workflow(client)
        late = await place(late_key)  # leaked mid-agent: a sweep during the agent takes it
        await async_wait_for(lambda: gone(late_key, late.handle["pid"]), timeout=15,
                             what="a sweep mid-agent")
        assert not (evidence / "grades.log").exists()  # the agent is still running
        live_pid = int((evidence / "env.pid").read_text())
        assert pid_alive(live_pid)
        job = await asyncio.wait_for(handle.wait(), 60)
        (run,) = job.runs
        assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 1), run.error
        assert len(read_lines(agents)) == 1 and len(read_lines(evidence / "grades.log")) == 1
        assert (substrate_dir(kept.key) / "state.json").exists() and pid_alive(kept.handle["pid"])
        log = worker.log.read_text()
        removed = [line for line in log.splitlines() if "gc: removed" in line]
        assert len(removed) == 3, log
        assert f"(key {closed_key}): workflow terminated" in log
        assert f"(key {leaked_key}): workflow not found and owner process gone" in log
        assert f"(key {late_key}): workflow terminated" in log
        worker.stop()
        assert worker.proc.returncode == 0 and "Traceback" not in worker.log.read_text()
    finally:
        await release(*[e for e in (closed, kept, late) if e is not None])
        if pid_alive(leaked_pid):
            os.killpg(leaked_pid, signal.SIGKILL)


async def test_gc_every_zero_disables_the_sweep(client, dev_server, task_queue, workers) -> None:
    """--gc-every 0: an orphan stays until someone runs gc."""
    key = await closed_workflow(client)
    orphan = await place(key)
    worker = WorkerProcess(dev_server.address, task_queue, env={"ROLLOUTS_LOG_LEVEL": "INFO"},
                           gc_every=0)
    workers.append(worker)
    try:
        await asyncio.sleep(3.0)
        assert (substrate_dir(key) / "state.json").exists() and pid_alive(orphan.handle["pid"])
        [found] = await gc.collect(client, prefix=key)  # it was an orphan all along
        assert (found.reason, found.removed) == ("workflow terminated", True)
        assert "gc: removed" not in worker.log.read_text()
    finally:
        await release(orphan)


async def test_rollouts_worker_command_sweeps(client, dev_server, task_queue, tmp_path: Path) -> None:
    """``rollouts worker --gc-every 1`` (the CLI path, also used by ``run --detach``) sweeps too,
    and stops cleanly on SIGTERM."""
    key = await closed_workflow(client)
    orphan = await place(key)
    log = tmp_path / "worker.log"
    proc = start_cli_worker(log, "--temporal", dev_server.address, "--task-queue", task_queue,
                            "--gc-every", "1")
    try:
        await async_wait_for(lambda: "ROLLOUTS_WORKER_READY" in log.read_text() or proc.poll() is not None,
                             timeout=30, what="worker start")
        await async_wait_for(lambda: gone(key, orphan.handle["pid"]), timeout=20, what="the sweep")
        await async_wait_for(lambda: f"(key {key}): workflow terminated" in log.read_text(),
                             timeout=5, what="the log line")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await release(orphan)


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--gc-every", "-1"], {}, "--gc-every"),
    ([], {"ROLLOUTS_GC_EVERY": "-5"}, "ROLLOUTS_GC_EVERY='-5'"),
    (["--gc-every", "soon"], {}, "--gc-every"),
])
def test_bad_gc_every_is_one_line_error(args: list[str], env: dict[str, str], named: str) -> None:
    """One ``error:`` line naming what was bad: the option, or the variable the user set."""
    result = subprocess.run(
        [sys.executable, "-m", "durable_rollouts.cli", "worker", "--temporal", "127.0.0.1:1", *args],
        check=False, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert "Traceback" not in result.stdout + result.stderr


def test_worker_module_rejects_a_negative_gc_every() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "durable_rollouts.worker", "--temporal", "127.0.0.1:1", "--gc-every", "-1"],
        check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--gc-every: must be a number of seconds >= 0" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_failed_sweep_is_a_warning_and_the_next_one_runs(client, monkeypatch, caplog) -> None:
    """An error in one sweep (here: listing the substrates) is logged; the loop goes on."""
    key = await closed_workflow(client)
    orphan = await place(key)
    real, calls = gc._candidates, []

    def flaky() -> list:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("docker socket hiccup")
        return real()

    monkeypatch.setattr(gc_orphans, "_candidates", flaky)  # where find_orphans looks it up
    caplog.set_level(logging.INFO, logger=gc.__name__)
    task = asyncio.ensure_future(gc.sweep(client, 0.3, first_delay_s=0))
    try:
        await async_wait_for(lambda: gone(key, orphan.handle["pid"]), timeout=15, what="the sweep")
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await release(orphan)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("WARNING", "gc sweep failed (next in 0.3s): OSError: docker socket hiccup") in messages
    assert any(level == "INFO" and f"(key {key}): workflow terminated" in m for level, m in messages)


def test_workflow_for_key_strips_attempt_and_verifier_suffixes() -> None:
    rollout = "job-abc-echo-1a2b-0-b1"
    for key in (rollout, f"{rollout}-a2", f"{rollout}-verifier", f"{rollout}-a2-v3-verifier",
                f"{rollout}-v2-verifier"):
        assert gc.workflow_for_key(key) == rollout, key


async def test_sweep_judges_containers_by_their_temporal_label(client) -> None:
    """A container labelled with another server is left to that server's workers; with this
    server's label an unknown workflow counts; unlabelled, only once the owner is gone too."""
    workflow_id = new_key()  # unknown to this server

    def container(server: str, owner_gone: bool = True) -> gc._Candidate:
        labels = {gc.LABEL_KEY: workflow_id, gc.LABEL_WORKFLOW: workflow_id, gc.LABEL_TEMPORAL: server}
        return gc._Candidate("docker", labels, {}, alive=True, owner_gone=owner_gone)

    judge = gc._cautious_reason
    assert await judge(container("elsewhere:7233/default"), workflow_id, client) is None
    assert await judge(container(gc.server_id(client)), workflow_id, client) == "workflow not found"
    assert await judge(container(""), workflow_id, client) == "workflow not found and owner process gone"
    assert await judge(container("", owner_gone=False), workflow_id, client) is None


async def test_removal_rechecks_a_substrate_that_is_in_use_again(client) -> None:
    """Between finding an orphan and removing it, its workflow started again (a resume reusing
    the live substrate by key): the removal re-asks Temporal and keeps it."""
    key = await closed_workflow(client)
    orphan = await place(key)
    try:
        [found] = await gc.find_orphans(client, prefix=key, cautious=True)
        await client.start_workflow("NoSuchWorkflow", id=key, task_queue=f"nobody-{uuid.uuid4().hex[:6]}")
        assert await gc._remove_checked(found, client, True) is False
        assert (substrate_dir(key) / "state.json").exists() and pid_alive(orphan.handle["pid"])
        assert await gc.collect(client, prefix=key, cautious=True) == []
    finally:
        await client.get_workflow_handle(key).terminate("test over")
        await release(orphan)
