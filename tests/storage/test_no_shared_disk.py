"""Workers that share no disk, and tasksets far over Temporal's payload limit.

"Hosts" here are worker processes in their own mount namespace (``unshare -m``) with a private
tmpfs mounted over the directory holding that host's ``ROLLOUTS_HOME``: nothing one worker writes
there is visible to the other worker or to the client (this test process, with its own empty
home). They share only the Temporal dev server and an S3 bucket on moto's standalone server (a
real HTTP S3 API on 127.0.0.1). Substrates are ``LocalRuntime`` (in the worker process, so its
steps are pinned to that worker's own queue).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, HERE, CountingAgent, read_lines

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job, start_job

REPO = Path(__file__).resolve().parents[2]
ROW_BYTES = 100_000

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                       reason="private mount namespaces need root and unshare"),
]


def _rows(evidence: Path, n: int, *, verified: bool) -> list[Task]:
    rows = []
    for i in range(n):
        task = Task(env="counting", id="echo", source=ENV_FILE, args={
            "expected": "x", "tag": f"r{i}-" + "p" * ROW_BYTES,
            "grade_log": str(evidence / f"grades-{i}.log")})
        if verified:
            task = task.model_copy(update={"verifier": Task(
                env="referee", id="referee", source=ENV_FILE,
                args={"expected": "x", "grade_log": str(evidence / f"referee-{i}.log")})})
        rows.append(task)
    return rows


class HostWorker:
    """``python -m durable_rollouts.worker`` in its own mount namespace with a private home."""

    def __init__(self, name: str, root: Path, logs: Path, address: str, queue: str,
                 env: dict[str, str]) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        home = self.dir / "home"
        self.log = logs / f"worker-{name}.log"
        worker = [sys.executable, "-m", "durable_rollouts.worker", "--temporal", address,
                  "--task-queue", queue, "--host-queue", f"{queue}@{name}", "--process-queue", "auto"]
        script = (f'mount -t tmpfs tmpfs "{self.dir}" && mkdir -p "{home}" && '
                  f'exec {" ".join(worker)}')
        penv = dict(os.environ, **env, ROLLOUTS_HOME=str(home),
                    PYTHONPATH=os.pathsep.join([str(HERE), str(REPO)]))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], env=penv, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while "ROLLOUTS_WORKER_READY" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"worker {name} did not start: {self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, **env, PYTHONPATH=os.pathsep.join([str(HERE), str(REPO)]))
    args = [*args, "--connect-timeout", "60"]  # a loaded CI box: not what this test is about
    return subprocess.run([sys.executable, "-m", "durable_rollouts.cli", *args], env=full,
                          capture_output=True, text=True, timeout=240)


async def test_workers_on_hosts_without_a_shared_disk_finish_a_4mb_taskset_readable_anywhere(
        s3_storage, s3_server, dev_server, task_queue, tmp_path: Path, monkeypatch) -> None:
    """40 rows x 100 KB (4 MB, twice Temporal's blob limit), each verified, run on two workers
    in private mount namespaces sharing only Temporal and the bucket. From a third "host" (this
    process, its own empty home): every answer, trace and grade is readable through
    ``get_job``, ``rollouts export``, ``rollouts trace`` and ``rollouts show``; the env and the
    verifier graded each rollout exactly once; the workers' homes stayed invisible to us."""
    url, bucket = s3_storage
    client_home = tmp_path / "client-home"
    monkeypatch.setenv("ROLLOUTS_HOME", str(client_home))
    evidence = tmp_path / "evidence"
    logs = tmp_path / "logs"
    evidence.mkdir()
    logs.mkdir()
    worker_env = {**s3_server.aws_env(), "ROLLOUTS_STORAGE": url}
    hosts = [HostWorker(n, tmp_path / "hosts", logs, dev_server.address, task_queue, worker_env)
             for n in ("host-a", "host-b")]
    try:
        from durable_rollouts.temporal.connection import connect_client

        client = await connect_client(dev_server.address)
        agents = evidence / "agents.log"
        handle = await start_job(Taskset("big", _rows(evidence, 40, verified=True)),
                                 CountingAgent(answer="x", log=str(agents)),
                                 runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                                 task_queue=task_queue, max_concurrent=20)
        job = await asyncio.wait_for(handle.wait(), 300)
    finally:
        for h in hosts:
            h.stop()
    assert [r.status for r in job.runs] == ["succeeded"] * 40, [r.error for r in job.runs]
    assert {line.split()[0] for line in read_lines(agents)} == {str(h.proc.pid) for h in hosts}
    for i in range(40):
        assert len(read_lines(evidence / f"grades-{i}.log")) == 1
        assert len(read_lines(evidence / f"referee-{i}.log")) == 1
    assert not any((tmp_path / "hosts").rglob("*.json")), "worker homes leaked to this host"
    assert any(size > 3_000_000 for size in s3_server.objects(bucket).values())  # the rows blob

    rebuilt = await get_job(job.id, client)
    assert [r.trace.content for r in rebuilt.runs] == ["x"] * 40
    assert all(r.trace.steps for r in rebuilt.runs) and all(r.reward == 1.0 for r in rebuilt.runs)

    env = {**s3_server.aws_env(), "ROLLOUTS_HOME": str(client_home)}
    out_file = tmp_path / "export.jsonl"
    done = _cli(["export", job.id, "-o", str(out_file), "--temporal", dev_server.address,
                 "--storage", url], env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(lines) == 40 and all(line["answer"] == "x" and line["trace"]["steps"] for line in lines)
    assert all(line["args"]["tag"].endswith("p" * 100) for line in lines)
    trace = _cli(["trace", job.id, "0", "--temporal", dev_server.address, "--storage", url], env)
    assert trace.returncode == 0 and "(no trace recorded)" not in trace.stdout, trace.stdout + trace.stderr
    show = _cli(["show", job.id, "--temporal", dev_server.address, "--storage", url], env)
    assert show.returncode == 0 and "succeeded" in show.stdout, show.stdout + show.stderr


async def test_a_4mb_taskset_runs_to_the_end_on_one_machine_with_the_file_driver(
        dev_server, task_queue, tmp_path: Path, monkeypatch) -> None:
    """The same 40 x 100 KB taskset on the default store (file://$ROLLOUTS_HOME/storage) with
    the embedded in-process worker: it starts (no 'Blob data size exceeds limit'), every rollout
    succeeds and no history event carries the rows."""
    monkeypatch.delenv("ROLLOUTS_STORAGE", raising=False)
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path / "home"))
    from durable_rollouts.temporal.batches import shutdown_embedded
    from durable_rollouts.temporal.connection import connect_client

    evidence = tmp_path / "evidence"
    evidence.mkdir()
    client = await connect_client(dev_server.address)
    try:
        handle = await start_job(Taskset("big-local", _rows(evidence, 40, verified=False)),
                                 CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                 temporal=client, worker=True, task_queue=task_queue, max_concurrent=20)
        job = await asyncio.wait_for(handle.wait(), 300)
        history = await handle.handle.fetch_history()
    finally:
        await shutdown_embedded()
    assert [r.status for r in job.runs] == ["succeeded"] * 40
    assert max(e.ByteSize() for e in history.events) < 1_000_000
    assert (tmp_path / "home" / "storage" / "sha256").is_dir()
