"""Agents and process helpers for the Temporal tests (importable by worker subprocesses).

Worker subprocesses get this directory on PYTHONPATH, so ``temporal_helpers:CountingAgent``
imports there just as in the test process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from durable_rollouts.models import Step
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.run import Run
from durable_rollouts.temporal.connection import (
    _free_port,
    _listening,
    _wait_ready,
    dev_server_args,
)

HERE = Path(__file__).resolve().parent
ENV_FILE = str(HERE / "counting_env.py")
TURNS_ENV = str(HERE / "turns_env.py")  # ENV_FILE's env plus a ``turns`` MCP tool (a side effect in the env)


class CountingAgent(Agent):
    """Appends a line to ``log`` each time it starts, sleeps ``seconds`` (``slow_seconds`` for
    rows tagged one of ``slow_tags``; not once ``fast_file`` exists), answers ``answer`` (raises
    for the row tagged ``raise_for``)."""

    answer: str = "x"
    seconds: float = 0.0
    log: str = ""
    fast_file: str = ""
    raise_for: str = ""  # the row whose args' tag is this raises (the rollout errors)
    slow_tags: list[str] = []
    slow_seconds: float = 0.0

    async def __call__(self, run: Run) -> None:
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"{os.getpid()} {run.rollout_id}\n")
        if self.raise_for and run.task is not None and run.task.args.get("tag") == self.raise_for:
            raise RuntimeError(f"agent gives up on {self.raise_for}")
        if not (self.fast_file and os.path.exists(self.fast_file)):
            slow = run.task is not None and run.task.args.get("tag") in self.slow_tags
            await asyncio.sleep(self.slow_seconds if slow else self.seconds)
        run.trace.content = self.answer


class FailOnceAgent(Agent):
    """Logs ``<pid> <session id> <restored turn>`` per attempt to ``log``, checkpoints turn 1
    (unless ``checkpoint=False``), and on its first attempt then raises a model API error
    (``retryable`` or not); later attempts answer ``answer``."""

    answer: str = "x"
    log: str = ""
    retryable: bool = True
    checkpoint: bool = True

    async def __call__(self, run: Run) -> None:
        from durable_rollouts.errors import ModelAPIError

        restored = (run.restored_state or {}).get("turn")
        with open(self.log, "a") as fh:
            fh.write(f"{os.getpid()} {run.client.session_id if run.client else None} {restored}\n")
        if restored is None and self.checkpoint:
            await run.checkpoint({"turn": 1})
        first = len(Path(self.log).read_text().splitlines()) == 1
        if first:
            raise ModelAPIError("answered 503: try again" if self.retryable else "answered 401: bad key",
                                retryable=self.retryable, status=503 if self.retryable else 401,
                                retry_after_s=0.2 if self.retryable else None)
        run.trace.content = self.answer


class CheckpointingAgent(Agent):
    """``turns`` turns, each logged as ``<pid> <session id> <turn>`` to ``log`` and then
    checkpointed; resumes after the last checkpointed turn. Answers ``answer``."""

    turns: int = 3
    log: str = ""
    answer: str = "x"

    async def __call__(self, run: Run) -> None:
        turn = (run.restored_state or {}).get("turn", 0)
        while turn < self.turns:
            turn += 1
            with open(self.log, "a") as fh:
                fh.write(f"{os.getpid()} {run.client.session_id if run.client else None} {turn}\n")
            await run.checkpoint({"turn": turn})
        run.trace.content = self.answer


class BigTraceAgent(Agent):
    """Records a trace of about ``size`` bytes (claim-check test)."""

    size: int = 1_000_000
    answer: str = "x"

    async def __call__(self, run: Run) -> None:
        chunk = "y" * 10_000
        for _ in range(self.size // len(chunk)):
            run.trace.record(Step(source="agent", messages=[{"role": "assistant", "content": chunk}]))
        run.trace.content = self.answer


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


async def async_wait_for(predicate, timeout: float = 30.0, interval: float = 0.05,
                         what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


class WorkerProcess:
    """``python -m durable_rollouts.worker`` as a real child process (SIGKILL-able)."""

    def __init__(self, address: str, task_queue: str, env: dict[str, str] | None = None,
                 gc_every: float | None = None, python: str = sys.executable,
                 cwd: str | None = None, args: tuple[str, ...] = ()) -> None:
        penv = dict(os.environ)
        penv.update(env or {})  # HERE stays on the path (fault_worker, temporal_helpers agents)
        penv["PYTHONPATH"] = os.pathsep.join([str(HERE), penv.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.log = Path(penv.get("ROLLOUTS_HOME", "/tmp")) / f"worker-{task_queue}-{time.time_ns()}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                # faults armed: the same product worker with the test's fault interceptor
                [python, "-m", "fault_worker" if "ROLLOUTS_FAULTS" in penv else "durable_rollouts.worker",
                 "--temporal", address,
                 "--task-queue", task_queue, "--process-queue", task_queue,
                 *([] if gc_every is None else ["--gc-every", str(gc_every)]), *args],
                env=penv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
            )
        try:
            wait_for(lambda: "ROLLOUTS_WORKER_READY" in self.log.read_text() or self.proc.poll() is not None,
                     timeout=30, what="worker start")
        except AssertionError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker did not start: {self.log.read_text()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class DevServer:
    """A ``temporal server start-dev`` child process on a sqlite file (restartable)."""

    def __init__(self, db_file: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.db_file = db_file
        self.extra_args = list(extra_args)  # e.g. ("--dynamic-config-value", "KEY=VALUE")
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.db_file.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen([*dev_server_args(self.port, None, self.db_file), *self.extra_args],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(lambda: _listening(self.port), timeout=30, what="dev server")
        # listening is not ready: wait until the frontend answers a real client (own loop/thread)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _wait_ready(self.address, self.proc, 30)).result()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        wait_for(lambda: not _listening(self.port), timeout=10, what="dev server stop")


@contextmanager
def configured_server(folder: Path, config: dict[str, object]) -> Iterator[DevServer]:
    """A dev server on ``folder/temporal.db`` with these dynamic config values (a limit lowered so
    a test stays small), started for the block and stopped after it."""
    args = [arg for key, value in config.items() for arg in ("--dynamic-config-value", f"{key}={value}")]
    server = DevServer(folder / "temporal.db", extra_args=tuple(args))
    server.start()
    try:
        yield server
    finally:
        server.stop()
