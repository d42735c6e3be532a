"""Fixtures of the training-results tests: one real dev server per session (search attributes
registered, as the embedded server does), a client and a task queue per test, and helpers to
run the real ``rollouts`` CLI and the real ``temporal`` CLI against that server.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "temporal"))  # temporal_helpers (DevServer), counting_env
sys.path.insert(0, str(HERE.parent / "cli"))  # cli_helpers (rollouts as a subprocess)

from temporal_helpers import DevServer  # noqa: E402

from durable_rollouts.temporal.batches import shutdown_embedded  # noqa: E402
from durable_rollouts.temporal.connection import connect_client  # noqa: E402


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
    return f"train-{uuid.uuid4().hex[:10]}"
