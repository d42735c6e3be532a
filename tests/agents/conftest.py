"""Fixtures of the durable-turn tests: a real dev server, worker processes, the scripted model.

Worker subprocesses get this directory and ``tests/temporal`` on PYTHONPATH so the agents and
envs here import there as in the test process.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "temporal"))
sys.path.insert(0, str(HERE))

from agent_helpers import StepsModel  # noqa: E402
from temporal_helpers import DevServer, WorkerProcess  # noqa: E402

from durable_rollouts.sdk.orchestrate import shutdown_embedded  # noqa: E402
from durable_rollouts.sdk.temporal import connect_client  # noqa: E402

os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")


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
    return f"turns-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def start_worker(dev_server: DevServer, task_queue: str) -> Iterator[object]:
    """``start_worker(**env)`` starts a worker process (this dir on its path); all stopped after."""
    started: list[WorkerProcess] = []
    path = os.pathsep.join([str(HERE), str(HERE.parent / "temporal"),
                            os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def start(**env: str) -> WorkerProcess:
        w = WorkerProcess(dev_server.address, task_queue, env={"PYTHONPATH": path, **env})
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
async def model() -> AsyncIterator[object]:
    """``await model(**kwargs)`` starts a :class:`StepsModel`; all stopped afterwards."""
    servers: list[StepsModel] = []

    async def make(**kwargs: object) -> StepsModel:
        server = await StepsModel(**kwargs).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    folder = tmp_path / "evidence"
    folder.mkdir()
    return folder
