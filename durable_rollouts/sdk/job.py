"""``Job``: a batch of graded runs with rewards, errors and per-group statistics.

A plain object (no I/O of its own except ``from_results`` reading traces and ``export``).
Rewards mean what a trainer thinks: only a ``succeeded`` run has a ``reward``; runs of a group
dropped by ``on_error="drop_group"`` (``mark_dropped``) are left out of every statistic.
``Job.start`` opens a job that several ``Taskset.run(..., job=job)`` calls append to, as a
training loop does. Imports models, run and tracestore only.
"""

from __future__ import annotations

import importlib
import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models import ERROR_STATUSES, AgentSpec, RolloutResult
from ..stores.tracestore import TraceStore
from .export_formats import check_format, write_lines
from .run import Run

__all__ = ["GroupStats", "Job", "mark_dropped"]

LIVE_JOBS = "durable_rollouts.temporal.live"  # its attach runs Job.attach


def mark_dropped(runs: Iterable[Run], on_error: str) -> list[str]:
    """With ``on_error="drop_group"``, set ``dropped`` on every run of a group that has an
    unrecovered error; returns the dropped group ids (in order). Other policies drop nothing."""
    runs = list(runs)
    if on_error != "drop_group":
        return []
    bad = list(dict.fromkeys(r.group_id for r in runs if r.status in ERROR_STATUSES))
    for run in runs:
        run.dropped = run.group_id in bad
    return bad


@dataclass(frozen=True)
class GroupStats:
    """Reward statistics of one group (the repeats of one task sharing a group id)."""

    group_id: str
    slug: str
    n: int
    graded: int
    mean: float | None
    std: float | None

    @property
    def zero_spread(self) -> bool:
        """True when every graded run of the group got the same reward (no learning signal)."""
        return self.graded > 0 and (self.std or 0.0) == 0.0


class Job:
    """A batch of runs.

    Args:
        id: the job id (a uuid hex by default).
        name: a human name (the taskset's name by default).
        group: how many rollouts each task gets (the default of batches appended to this job).
        runs: runs in expansion order (task-major).
    """

    def __init__(self, id: str | None = None, name: str = "job", *, group: int = 1,
                 runs: Iterable[Run] | None = None, taskset: str | None = None) -> None:
        self.id = id or uuid.uuid4().hex
        self.name = name
        self.group = group
        self.taskset = taskset
        self.runs: list[Run] = list(runs or [])
        self.created_at = time.time()
        self.batches = 0  # how many runs were appended to this job (an open job grows)
        self.agent: AgentSpec | None = None  # the agent of its batches (named in ATIF exports)

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, name={self.name!r}, runs={len(self.runs)}, reward={self.reward})"

    @classmethod
    async def start(cls, name: str, *, group: int = 1, id: str | None = None) -> Job:
        """Open a job that several ``Taskset.run(..., job=job)`` calls append to; each batch
        runs every row ``group`` times unless that call passes its own ``group``."""
        return cls(id=id, name=name, group=group)

    @classmethod
    async def attach(cls, job_id: str, *, temporal: Any = None, **kwargs: Any) -> Any:
        """The live job ``job_id`` (started with ``Taskset.start``), e.g. after a trainer restart:
        ``job.stream(consumer=...)`` then delivers every group that consumer has not acknowledged.
        ``worker=True`` runs an in-process worker for it (the default on the embedded server)."""
        attach = importlib.import_module(LIVE_JOBS).attach  # the Temporal layer, by module name
        return await attach(job_id, temporal=temporal, **kwargs)

    @staticmethod
    def batch_group(group: int | None, job: Job | None) -> int:
        """The group size of one batch: the call's own, else the open job's, else 1."""
        if group is not None:
            return group
        return job.group if job is not None else 1

    @classmethod
    def from_results(cls, id: str, name: str, results: Iterable[RolloutResult],
                     store: TraceStore | None = None, *, group: int = 1) -> Job:
        """Build a job from compact results, loading each trace from ``store`` when it can."""
        store = store or TraceStore()
        runs = []
        for result in results:
            trace = None
            if result.trace_ref is not None:
                try:
                    trace = store.get(result.trace_ref)
                except (OSError, ValueError):
                    trace = None  # a missing trace must not hide the result
            runs.append(Run.from_result(result, trace, job_id=id))
        return cls(id=id, name=name, group=group, runs=runs)

    # -- aggregates -----------------------------------------------------------------------

    @property
    def graded(self) -> list[Run]:
        """Runs whose reward counts: succeeded with a valid grade, and not dropped."""
        return [r for r in self.runs if r.counted]

    @property
    def errors(self) -> list[Run]:
        """Runs without a reward (failed, errored, timed out, cancelled, or an invalid grade)."""
        return [r for r in self.runs if r.reward is None]

    @property
    def dropped_groups(self) -> list[str]:
        """Group ids left out by ``on_error="drop_group"``."""
        return list(dict.fromkeys(r.group_id for r in self.runs if r.dropped))

    @property
    def reward(self) -> float | None:
        """Mean reward over the counted runs (``graded``); errored runs never enter it."""
        rewards = [r.reward for r in self.graded if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def results(self) -> dict[str, list[Run]]:
        """Runs by task slug."""
        out: dict[str, list[Run]] = {}
        for run in self.runs:
            out.setdefault(run.slug, []).append(run)
        return out

    @property
    def groups(self) -> dict[str, list[Run]]:
        """Runs by group id, in expansion order."""
        out: dict[str, list[Run]] = {}
        for run in self.runs:
            out.setdefault(run.group_id, []).append(run)
        return out

    def group_stats(self) -> dict[str, GroupStats]:
        """Mean and (population) standard deviation of rewards per group."""
        out = {}
        for gid, runs in self.groups.items():
            rewards = [r.reward for r in runs if r.counted and r.reward is not None]
            mean = sum(rewards) / len(rewards) if rewards else None
            std = (math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
                   if rewards and mean is not None else None)
            out[gid] = GroupStats(gid, runs[0].slug, len(runs), len(rewards), mean, std)
        return out

    @property
    def zero_spread_groups(self) -> list[str]:
        """Group ids whose graded runs all got the same reward."""
        return [gid for gid, s in self.group_stats().items() if s.zero_spread]

    def status_counts(self) -> dict[str, int]:
        """How many runs are in each status."""
        out: dict[str, int] = {}
        for run in self.runs:
            out[run.status] = out.get(run.status, 0) + 1
        return out

    # -- output ---------------------------------------------------------------------------

    def export(self, path: str | Path, format: str = "jsonl") -> Path:
        """Write one line per run in ``format``: ``jsonl`` (our record), ``openai`` (chat
        fine-tuning lines), ``atif`` (one ATIF-v1.8 trajectory per line) or ``atif-1.4``
        (ATIF-v1.4); see ``export_formats``. An unknown format raises ConfigError."""
        check_format(format)  # before the file is opened: a bad format leaves no empty file
        path = Path(path)
        with path.open("w") as fh:
            write_lines(self.runs, fh, format, self.agent)
        return path

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON record per run (``export(path, "jsonl")``)."""
        return self.export(path, "jsonl")
