"""A worker SIGKILLed between a substrate's create call and its answer; the batch must not leak.

:func:`run_with_a_dying_create` starts a real worker process, starts a batch on its task queue,
waits until the provider (the real Docker engine behind a holding proxy, or a stand-in) says a
create was received and its answer is being held, SIGKILLs that worker, starts a second one and
waits for the batch. The provision retried on the second worker must find what the first attempt
made (named or labelled after the rollout key) and adopt or remove it before making anything new.
:func:`lifetimes` counts ``(made|gone, key)`` events (the engine's, or a stand-in's): substrates
made per rollout key, the most alive at once, how many are left. ``temporal_address`` and ``client`` come from conftest.py.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporal_helpers import WorkerProcess

from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job

HERE = Path(__file__).resolve().parent
TEMPORAL_TESTS = HERE.parent / "temporal"


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
