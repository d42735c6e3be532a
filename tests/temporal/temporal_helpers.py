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
from pathlib import Path

from durable_rollouts.models import Step
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.run import Run

HERE = Path(__file__).resolve().parent
ENV_FILE = str(HERE / "counting_env.py")


class CountingAgent(Agent):
    """Appends a line to ``log`` each time it starts, sleeps ``seconds``, answers ``answer``."""

    answer: str = "x"
    seconds: float = 0.0
    log: str = ""

    async def __call__(self, run: Run) -> None:
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"{os.getpid()} {run.rollout_id}\n")
        await asyncio.sleep(self.seconds)
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

    def __init__(self, address: str, task_queue: str, env: dict[str, str] | None = None) -> None:
        penv = dict(os.environ)
        penv["PYTHONPATH"] = os.pathsep.join([str(HERE), penv.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        penv.update(env or {})
        self.log = Path(penv.get("ROLLOUTS_HOME", "/tmp")) / f"worker-{task_queue}-{time.time_ns()}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "durable_rollouts.worker", "--temporal", address,
                 "--task-queue", task_queue, "--process-queue", task_queue],
                env=penv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
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
