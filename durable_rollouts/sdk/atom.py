"""The rollout atom of seed 000, ``rollout(task, agent, runtime=...) -> Run``, as a batch of one.

It runs one row once through ``Taskset.run`` (durable: a Temporal workflow, like any batch) or,
with ``durable=False``, through the direct executor; both walk the card's steps. ``Task.run``
(seeds 002 and 004: ``await task.run(agent)`` -> Job) is the same batch of one, returning the Job.
"""

from __future__ import annotations

from typing import Any

from ..models import Task
from .direct import run_direct
from .job import Job
from .run import Run
from .taskset import Taskset

__all__ = ["rollout"]


async def rollout(task: Task, agent: Any, *, runtime: Any = None, durable: bool = True,
                  job: Job | None = None, rollout_timeout: float | None = None,
                  **options: Any) -> Run:
    """Run ``task`` once with ``agent`` on ``runtime`` and return its graded ``Run``.

    Args:
        runtime: any provider (None: served from the env file the row names, per rollout).
        durable: run it as a Temporal workflow (default, as ``Taskset.run``); False runs the
            same steps in plain asyncio in this process.
        job: an open Job to append the run to (default: a new one, named after the task).
        options: more ``Taskset.run`` keywords (``temporal``, ``retries`` ...; durable only).
    """
    taskset = Taskset(task.id, [task])
    if durable:
        done = await taskset.run(agent, runtime=runtime, group=1, job=job,
                                 rollout_timeout=rollout_timeout, **options)
    else:
        done = await run_direct(taskset, agent, runtime, 1, rollout_timeout=rollout_timeout,
                                job=job, **options)
    return done.runs[-1]
