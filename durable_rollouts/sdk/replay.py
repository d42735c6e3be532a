"""Re-grading without re-running: ``ReplayTaskset``, the taskset of saved rollouts.

``await Taskset.replay(source)`` builds one from a ``Job``, a ``jsonl`` export file or a job id
(read through Temporal, looked up by module name so sdk stays Temporal-free);
``await replay.run(runtime=...)`` re-grades it into a new job. Every saved rollout with a final
answer runs again as a real ``Rollout`` (the card's steps: provision, connect, start, agent,
grade, [verify], teardown) whose agent is the model-free :class:`ReplayAgent`: the environment
grades the saved answer anew in a fresh session. Rollouts without an answer are not run:
:attr:`ReplayTaskset.skipped` lists them with the reason.

Groups survive: each saved group becomes one group of the new job (its members with an answer,
re-indexed from 0), so group statistics stay per task. A batch runs rows x group with unique
slugs, so groups of other sizes, or a task that several saved groups ran, go to further batches
of the same new job. ``grader="env.py"`` grades with that file's templates instead (every row's
``source`` becomes it: the same task ids and args, a new reward function). Imports the sdk's
taskset, job, agents and trace store, and envserver's loader lazily (to check a grader file).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models import ProviderSpec, Task
from ..stores.tracestore import TraceStore
from .job import Job
from .replay_agent import REPLAY_LINK, ReplayAgent, ReplayEntry, ReplayManifest, entry_key
from .saved_rollouts import SavedRollout, from_run, read_export
from .taskset import DURABLE_EXECUTOR, Taskset

__all__ = ["RegradeSummary", "ReplayBatch", "ReplayTaskset", "RewardChange", "check_grader",
           "is_export_path", "plan_batches", "replay_taskset"]

JOB_READER = "durable_rollouts.temporal.regrade"  # its saved_job reads a job id's rollouts
FILE_RUNTIMES = ("local", "subprocess")  # the runtimes that serve a row's env file (``source``)
STORE_CONCURRENCY = 32  # saved traces written to the store at once (those of an export file)


@dataclass
class ReplayBatch:
    """One batch of a re-grade: rows with unique slugs, each run ``group`` times; ``members``
    maps ``entry_key(slug, new group index)`` to the saved rollout it re-plays."""

    group: int
    rows: list[Task] = field(default_factory=list)
    members: dict[str, SavedRollout] = field(default_factory=dict)


def plan_batches(saved: list[SavedRollout]) -> list[ReplayBatch]:
    """Place every saved group (its members with an answer) in the first batch of its size that
    does not have its task yet; its members become group indices 0, 1, ... in saved order."""
    groups: dict[tuple[str, str], list[SavedRollout]] = {}
    for rollout in saved:
        assert rollout.task is not None
        groups.setdefault((rollout.group_id, rollout.task.slug), []).append(rollout)
    batches: list[ReplayBatch] = []
    for members in groups.values():
        members.sort(key=lambda r: r.group_index)
        task = members[0].task
        assert task is not None
        batch = next((b for b in batches if b.group == len(members)
                      and entry_key(task.slug, 0) not in b.members), None)
        if batch is None:
            batch = ReplayBatch(group=len(members))
            batches.append(batch)
        batch.rows.append(task)
        for index, rollout in enumerate(members):
            batch.members[entry_key(task.slug, index)] = rollout
    return batches


@dataclass(frozen=True)
class RewardChange:
    """One re-graded rollout: its old and new outcome."""

    rollout_id: str  # in the new job
    source_rollout_id: str
    slug: str
    old_status: str
    new_status: str
    old_reward: float | None
    new_reward: float | None

    @property
    def changed(self) -> bool:
        old, new = self.old_reward, self.new_reward
        if old is None or new is None:
            return old is not new
        return not math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-12)


@dataclass(frozen=True)
class RegradeSummary:
    """Old against new rewards of a re-grade (rewards as a trainer counts them: succeeded only)."""

    job_id: str
    rollouts: list[RewardChange]
    skipped: list[SavedRollout]

    @property
    def changed(self) -> list[RewardChange]:
        return [r for r in self.rollouts if r.changed]

    @staticmethod
    def _mean(values: list[float | None]) -> float | None:
        counted = [v for v in values if v is not None]
        return sum(counted) / len(counted) if counted else None

    @property
    def old_reward(self) -> float | None:
        return self._mean([r.old_reward for r in self.rollouts])

    @property
    def new_reward(self) -> float | None:
        return self._mean([r.new_reward for r in self.rollouts])

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "regraded": len(self.rollouts), "changed": len(self.changed),
            "unchanged": len(self.rollouts) - len(self.changed), "old_reward": self.old_reward,
            "new_reward": self.new_reward,
            "skipped": [{"rollout_id": s.rollout_id, "job_id": s.job_id, "reason": s.skip_reason}
                        for s in self.skipped],
            "rollouts": [{"rollout_id": r.rollout_id, "source_rollout_id": r.source_rollout_id,
                          "slug": r.slug, "old_status": r.old_status, "new_status": r.new_status,
                          "old_reward": r.old_reward, "new_reward": r.new_reward,
                          "changed": r.changed} for r in self.rollouts],
        }


class ReplayTaskset(Taskset):
    """The tasks of saved rollouts, for re-grading them (see the module docstring).

    Args:
        name: the taskset's (and by default the new job's) name.
        saved: the saved rollouts; those without an answer end up in :attr:`skipped`.
        runtime: the spec of the runtime the saved rollouts ran on (the default of :meth:`run`).
    """

    def __init__(self, name: str, saved: list[SavedRollout], *,
                 runtime: ProviderSpec | None = None) -> None:
        self.saved = [s for s in saved if s.skip_reason is None]
        self.skipped = [s for s in saved if s.skip_reason is not None]
        self.runtime_spec = runtime
        unique: dict[str, Task] = {}
        for rollout in self.saved:
            assert rollout.task is not None
            unique.setdefault(rollout.task.slug, rollout.task)
        super().__init__(name, unique.values())

    def __repr__(self) -> str:
        return (f"ReplayTaskset(name={self.name!r}, rollouts={len(self.rollouts)}, "
                f"skipped={len(self.skipped)})")

    @property
    def rollouts(self) -> list[SavedRollout]:
        """The saved rollouts a re-grade runs (of the rows this taskset still has: ``filter`` works)."""
        return [s for s in self.saved if s.task is not None and s.task.slug in self]

    def batches(self) -> list[ReplayBatch]:
        return plan_batches(self.rollouts)

    def with_grader(self, path: str | Path) -> ReplayTaskset:
        """The same re-grade, graded by the templates of env file ``path`` (every row's
        ``source`` becomes it; the file must define each task's env and task ids)."""
        source = check_grader(path, self.rollouts)
        clone = copy.copy(self)
        clone.saved = [_with_source(s, source) for s in self.saved]
        clone._tasks = {slug: task.model_copy(update={"source": source})
                        for slug, task in self._tasks.items()}
        return clone

    def for_grading(self, runtime: Any = None,
                    grader: str | Path | None = None) -> tuple[ReplayTaskset, Any]:
        """(this re-grade, graded by ``grader`` if given; the runtime it runs on), checked."""
        if grader is None:
            return self, self.default_runtime(runtime)
        return self.with_grader(grader), _grader_runtime(runtime, self.runtime_spec)

    def default_runtime(self, runtime: Any = None) -> Any:
        """``runtime``, else the saved job's own (rebuilt from its spec)."""
        if runtime is not None:
            return runtime
        if self.runtime_spec is None:
            raise ConfigError("re-grading saved rollouts from a Job object or an export file needs "
                              "runtime=... (the runtime is only known for a job id)")
        from ..runtimes import provider_from_spec

        return provider_from_spec(self.runtime_spec)

    async def run(self, agent: Any = None, *, runtime: Any = None, grader: str | Path | None = None,
                  max_concurrent: int = 16, temporal: Any = None, name: str | None = None,
                  wait: bool = True, **kwargs: Any) -> Any:
        """Re-grade every saved rollout with an answer into one new job; returns that Job.

        No agent is called: each rollout re-plays its saved trajectory (``ReplayAgent``) in a
        fresh session, which the environment grades (and verifies) anew. ``runtime`` defaults to
        the saved job's own. ``grader="env.py"`` grades with that env file's templates (with a
        local runtime unless ``runtime`` or the saved job's is a ``subprocess`` one).
        ``wait=False`` returns the started batches' handles instead. Given an ``agent``, the
        saved tasks run afresh with it instead (``Taskset.run``). More keyword arguments as for
        :meth:`Taskset.run` (``rollout_timeout``, ``retries``, ``on_error``, ``task_queue``,
        ``worker``).
        """
        if agent is not None:
            return await super().run(agent, runtime=self.default_runtime(runtime),
                                     max_concurrent=max_concurrent, temporal=temporal, name=name,
                                     **kwargs)
        replay, runtime = self.for_grading(runtime, grader)
        batches = replay.batches()
        if not batches:
            raise ConfigError(f"nothing to re-grade: none of the {len(self.saved) + len(self.skipped)} "
                              "saved rollouts has an answer")
        executor = importlib.import_module(DURABLE_EXECUTOR)  # also registers ROLLOUTS_STORAGE
        job = Job(name=name or self.name, group=max(b.group for b in batches), taskset=self.name)
        handles: list[Any] = []
        try:
            for batch in batches:
                manifest = await _manifest_for(batch)
                handles.append(await executor.run_taskset(
                    Taskset(self.name, batch.rows), ReplayAgent(manifest=manifest),
                    runtime=runtime, group=batch.group, max_concurrent=max_concurrent, job=job,
                    temporal=temporal, name=job.name, wait=False, **kwargs))
        except BaseException:
            for handle in handles:
                await handle.release()
            raise
        if not wait:
            return handles
        for index, handle in enumerate(handles):
            try:
                await handle.wait()
            except BaseException:
                for later in handles[index + 1:]:
                    await later.release()
                raise
        return job

    def compare(self, job: Job) -> RegradeSummary:
        """Old against new rewards: each run of ``job`` (this re-grade's) matched to the saved
        rollout it re-played: by position (a job lists its batches' runs in expansion order,
        as :meth:`batches` planned them), else by ``trace.extra["regrade"]``."""
        planned: list[SavedRollout | None] = [
            batch.members[entry_key(row.slug, index)] for batch in self.batches()
            for row in batch.rows for index in range(batch.group)]
        if len(planned) != len(job.runs):  # not this plan: only runs whose agent step linked
            by_id = {s.rollout_id: s for s in self.saved}
            links = [(run.trace.extra.get(REPLAY_LINK) or {}).get("rollout_id") for run in job.runs]
            planned = [by_id.get(str(link)) for link in links]
        changes = [
            RewardChange(rollout_id=run.rollout_id, source_rollout_id=old.rollout_id,
                         slug=run.slug, old_status=old.status, new_status=run.status,
                         old_reward=old.reward, new_reward=run.reward)
            for run, old in zip(job.runs, planned) if old is not None]
        return RegradeSummary(job_id=job.id, rollouts=changes, skipped=list(self.skipped))


def _with_source(rollout: SavedRollout, source: str) -> SavedRollout:
    task = rollout.task.model_copy(update={"source": source}) if rollout.task is not None else None
    return replace(rollout, task=task)


async def _manifest_for(batch: ReplayBatch) -> str:
    """Store the batch's manifest (and any saved trace the workers cannot read yet); its uri."""
    store, gate = TraceStore(), asyncio.Semaphore(STORE_CONCURRENCY)

    async def trace_uri(rollout: SavedRollout) -> str:
        if rollout.trace_uri is not None and rollout.trace_uri.startswith("rollouts-storage:"):
            return rollout.trace_uri
        assert rollout.trace is not None  # skip_reason is None: it has an answer
        async with gate:
            return (await store.aput(rollout.trace.model_copy(deep=True))).uri

    uris = await asyncio.gather(*(trace_uri(r) for r in batch.members.values()))
    entries = {
        key: ReplayEntry(trace=uri, job_id=r.job_id, rollout_id=r.rollout_id, group_id=r.group_id,
                         group_index=r.group_index, status=r.status, reward=r.reward,
                         grade_reward=r.grade_reward)
        for (key, r), uri in zip(batch.members.items(), uris)}
    return await asyncio.to_thread(ReplayManifest(entries=entries).store)


def check_grader(path: str | Path, rollouts: list[SavedRollout]) -> str:
    """The resolved path of grader env file ``path``, after checking that it defines every
    saved task's env with its task ids (ConfigError otherwise)."""
    from ..envserver.loader import load_environment

    file = Path(path)
    if file.suffix != ".py":
        raise ConfigError(f"grader {path}: give an environment file (ENV.py)")
    if not file.is_file():
        raise ConfigError(f"grader file not found: {path}")
    needed: dict[str, set[str]] = {}
    for rollout in rollouts:
        assert rollout.task is not None
        needed.setdefault(rollout.task.env, set()).add(rollout.task.id)
    for env_name, ids in needed.items():
        try:
            env = load_environment(str(file.resolve()), env_name)
        except ConfigError as exc:
            raise ConfigError(f"grader {path}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - whatever the user's file raises on import
            raise ConfigError(f"grader {path}: importing it failed: {type(exc).__name__}: {exc}") from None
        missing = sorted(ids - set(env.templates))
        if missing:
            raise ConfigError(f"grader {path}: environment {env.name!r} has no task "
                              f"{', '.join(missing)} (it has {', '.join(sorted(env.templates)) or 'none'})")
    return str(file.resolve())


def _grader_runtime(runtime: Any, saved_spec: ProviderSpec | None) -> Any:
    """The runtime of a re-grade with a grader file: one that serves each row's env file."""
    from ..runtimes import LocalRuntime, SubprocessRuntime

    if runtime is not None:
        if getattr(runtime, "kind", None) not in FILE_RUNTIMES:
            raise ConfigError(f"a grader file is served by a local or subprocess runtime, not "
                              f"{getattr(runtime, 'kind', type(runtime).__name__)!r}")
        return runtime
    if saved_spec is not None and saved_spec.kind == SubprocessRuntime.kind:
        return SubprocessRuntime()
    return LocalRuntime()


def is_export_path(source: str | Path) -> bool:
    """Whether ``source`` names an export file rather than a job id."""
    text = str(source)
    return (isinstance(source, Path) or text.endswith((".jsonl", ".json")) or "/" in text
            or Path(text).exists())


async def replay_taskset(source: Any, *, temporal: Any = None, name: str | None = None) -> ReplayTaskset:
    """``Taskset.replay``: a ReplayTaskset of a ``Job``, a ``jsonl`` export file or a job id."""
    if isinstance(source, Job):
        saved = [from_run(run, source.id) for run in source.runs]
        return ReplayTaskset(name or f"{source.name}-regrade", saved)
    if not isinstance(source, (str, Path)):
        raise ConfigError(f"replay takes a Job, an export file or a job id, not {type(source).__name__}")
    text = str(source)
    if is_export_path(source):
        saved = await asyncio.to_thread(read_export, text)
        return ReplayTaskset(name or f"{Path(text).stem}-regrade", saved)
    job_name, saved, spec = await importlib.import_module(JOB_READER).saved_job(text, temporal)
    return ReplayTaskset(name or f"{job_name}-regrade", saved, runtime=spec)
