"""A worker SIGKILLed between a substrate's create call and its answer; the batch must not leak.

:func:`run_with_a_dying_create` starts a real worker process, starts a batch on its task queue,
waits until the provider (the real Docker engine behind a holding proxy, or a stand-in) says a
create was received and its answer is being held, SIGKILLs that worker, starts a second one and
waits for the batch. The provision retried on the second worker must find what the first attempt
made (named or labelled after the rollout key) and adopt or remove it before making anything new.
:func:`lifetimes` reads a stand-in's ``made|gone KEY ID`` lines: substrates made per rollout
key and the most alive at once. The test modules import ``temporal_address`` and ``client``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporal_helpers import DevServer, WorkerProcess

from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import shutdown_embedded, start_job
from durable_rollouts.temporal.connection import connect_client

HERE = Path(__file__).resolve().parent
TEMPORAL_TESTS = HERE.parent / "temporal"


@pytest.fixture(scope="module")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``temporal server start-dev`` for the module (import this fixture by name)."""
    server = DevServer(tmp_path_factory.mktemp("temporal") / "temporal.db")
    server.start()
    yield server.address
    server.stop()


@pytest.fixture
async def client(temporal_address: str) -> AsyncIterator[object]:
    yield await connect_client(temporal_address)
    await shutdown_embedded()


@dataclass
class Lifetimes:
    """Substrates made (the key of each), the most alive at once per key, how many are alive."""

    made: list[str]
    most: dict[str, int]
    alive: int


def lifetimes(events: Iterable[tuple[str, str]]) -> Lifetimes:
    """``(made|gone, key)`` pairs in the order they happened, as :class:`Lifetimes`."""
    made: list[str] = []
    live: dict[str, int] = {}
    most: dict[str, int] = {}
    for what, key in events:
        live[key] = live.get(key, 0) + (1 if what == "made" else -1)
        if what == "made":
            made.append(key)
            most[key] = max(most.get(key, 0), live[key])
    return Lifetimes(made, most, sum(live.values()))


def logged_lifetimes(log: Path) -> Lifetimes:
    """A stand-in's ``events.log`` (lines ``made|gone KEY ID``) as :class:`Lifetimes`."""
    lines = log.read_text().splitlines() if log.exists() else []
    return lifetimes((line.split()[0], line.split()[1]) for line in lines)


@dataclass
class DyingCreate:
    """What happened: the finished job and the two workers' pids."""

    job: Job
    killed_pid: int
    second_pid: int


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A worker's environment: this directory and tests/temporal importable, plus ``extra``."""
    return {"PYTHONPATH": os.pathsep.join([str(HERE), str(TEMPORAL_TESTS)]), **(extra or {})}


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def run_with_a_dying_create(
    *,
    client: Any,
    address: str,
    runtime: Any,
    tasks: list[Any],
    agent: Any,
    create_held: Callable[[], bool],
    env: dict[str, str] | None = None,
    timeout: float = 150.0,
) -> DyingCreate:
    """Run ``tasks`` on ``runtime``; SIGKILL the worker once ``create_held()`` says a create
    was received and its answer is held; a second worker finishes the batch."""
    queue = f"dying-create-{uuid.uuid4().hex[:8]}"
    first = await asyncio.to_thread(WorkerProcess, address, queue, worker_env(env))
    second: WorkerProcess | None = None
    try:
        handle = await start_job(Taskset("dying-create", tasks), agent, runtime=runtime,
                                 temporal=client, worker=False, task_queue=queue)
        await asyncio.to_thread(_wait, create_held, 60, "a create call to be received and held")
        first.kill()  # between the create call and its answer
        second = await asyncio.to_thread(WorkerProcess, address, queue, worker_env(env))
        job = await asyncio.wait_for(handle.wait(), timeout)
        return DyingCreate(job, first.pid, second.pid)
    finally:
        first.kill()
        if second is not None:
            await asyncio.to_thread(second.stop)
