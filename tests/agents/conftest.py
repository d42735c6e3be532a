"""Fixtures of the durable-turn tests: a real dev server, worker processes, the scripted model.

Worker subprocesses get this directory and ``tests/temporal`` on PYTHONPATH so the agents and
envs here import there as in the test process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent_helpers import StepsModel
from temporal_helpers import DevServer, WorkerProcess

HERE = Path(__file__).resolve().parent


os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")


from temporal_fixtures import client, dev_server, task_queue  # noqa: E402,F401  (shared fixtures)


@pytest.fixture(autouse=True)
def short_agent_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed worker's agent step runs again within 5 s here, not the default 20 s: these tests
    count turns and requests around a crash, not how soon it is noticed (that default is
    ``test_survival.test_a_dead_workers_agent_step_runs_again_within_30_s``). A test may set
    its own value."""
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")


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
