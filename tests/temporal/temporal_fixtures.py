"""The fixtures every Temporal test directory shares: one real dev server per directory and
session, a connected client and a fresh task queue per test.

A directory's conftest imports them (``from temporal_fixtures import client, dev_server,
task_queue``); pytest then gives that directory its own session server.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from temporal_helpers import DevServer

from durable_rollouts.temporal.batches import shutdown_embedded
from durable_rollouts.temporal.connection import connect_client

__all__ = ["client", "dev_server", "task_queue"]


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
