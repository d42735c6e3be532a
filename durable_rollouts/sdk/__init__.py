"""What users import: tasksets, jobs, runs, agents (and the bundled ones), exports, replay, file
tracking, and ``run_direct`` (the card's plan walked in plain asyncio).

Builds on ``steps`` (the step functions both executors call), ``runtimes``, ``client`` and the
shared models; never imported by ``envserver``, ``runtimes`` or ``steps``. Temporal-free: nothing
here imports temporalio or the Temporal layers (``tests/test_layering.py``); ``Taskset.run``
reaches ``durable_rollouts.temporal.batches`` by name, on use.
"""

from __future__ import annotations

from ..stores.tracestore import TraceStore
from .agents import Agent, load_agent
from .file_tracking import FileChange, FileChanges, file_tracking_observer
from .job import GroupStats, Job
from .run import Run
from .taskset import Taskset

__all__ = [
    "Agent",
    "FileChange",
    "FileChanges",
    "GroupStats",
    "Job",
    "Run",
    "Taskset",
    "TraceStore",
    "file_tracking_observer",
    "load_agent",
]
