"""Fixtures of the upgrade tests: one real Temporal dev server per session, a client per test.

The helpers of ``tests/temporal`` (``DevServer``, ``WorkerProcess``, the counting env) are
imported from there, as worker subprocesses do.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "temporal"))

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
