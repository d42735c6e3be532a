"""``Taskset``: named, slug-indexed rows of tasks, loaded from and saved to files.

``resolve_task`` is the lazy-resolution hook: the orchestrators call it once per *group*, so
every rollout of a group binds the same resolved task. ``run`` delegates to the durable
executor ``durable_rollouts.temporal.batches`` (looked up by name on use: sdk never imports the
Temporal layer, and importing this module never loads Temporal).
"""

from __future__ import annotations

import importlib
import inspect
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..hud_detect import is_hud_task, is_hud_taskset, missing_hud
from ..models import Task, task_slug
from ..moved import import_path
from .hud_compat import task_from_hud
from .job import Job
from .placement import resolve_placement
from .taskset_hooks import check_taskset_flags

if TYPE_CHECKING:
    from .agents import Agent

__all__ = ["Taskset", "load_taskset", "register_taskset", "taskset_class_path"]

DURABLE_EXECUTOR = "durable_rollouts.temporal.batches"  # its run_taskset runs Taskset.run
LIVE_JOBS = "durable_rollouts.temporal.live"  # its start_live runs Taskset.start
REPLAY = "durable_rollouts.sdk.replay"  # its replay_taskset builds Taskset.replay (a subclass)


class Taskset:
    """Rows of tasks indexed by slug.

    Args:
        name: the taskset's name (jobs default to it).
        tasks: the rows (``Task``, dicts, or HUD v6 ``hud.eval.Task`` rows); two rows with the
            same slug are rejected.

    Raises:
        ConfigError: duplicate slugs, or a row that is not a Task.
    """

    REQUIRES_GROUP_ROLLOUTS: bool = False
    """``resolve_task`` binds state a whole group shares: single rollouts are refused."""
    NEEDS_CONTAINER: bool = False
    """The environment must run in a container: host runtimes (local, subprocess, ssh) are refused."""

    def __init__(self, name: str, tasks: Iterable[Task | dict[str, Any] | Any] = ()) -> None:
        self.name = name
        self._tasks: dict[str, Task] = {}
        for row in tasks:
            task = _as_task(row)
            if task.slug in self._tasks:
                task = _longer_slug(task, self._tasks)
            if task.slug in self._tasks:
                raise ConfigError(f"taskset {name!r}: duplicate task slug {task.slug!r}")
            self._tasks[task.slug] = task

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, tasks={len(self)})"

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __getitem__(self, key: int | str) -> Task:
        if isinstance(key, int):
            return list(self._tasks.values())[key]
        return self._tasks[key]

    def __contains__(self, slug: object) -> bool:
        return slug in self._tasks

    @property
    def tasks(self) -> list[Task]:
        """The rows in order."""
        return list(self._tasks.values())

    @property
    def slugs(self) -> list[str]:
        return list(self._tasks)

    # -- lazy resolution ------------------------------------------------------------------

    def resolve_task(self, task: Task) -> Task:
        """Turn a row into the task that is actually run (identity by default).

        Override (sync or ``async def``) to resolve lazily, e.g. to pick a fresh problem per
        group. It is called once per group; every rollout of the group runs the result.
        """
        return task

    async def aresolve(self, task: Task) -> Task:
        """Call :meth:`resolve_task`, awaiting it when it is a coroutine function."""
        result = self.resolve_task(task)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Task):
            raise ConfigError(f"{type(self).__name__}.resolve_task returned {type(result).__name__}, not a Task")
        return result

    # -- selection ------------------------------------------------------------------------

    def filter(self, predicate: Callable[[Task], bool] | None = None, *,
               slugs: Iterable[str] | None = None, ids: Iterable[str] | None = None,
               env: str | None = None) -> Taskset:
        """A taskset of the rows matching every given criterion (same class, same name)."""
        slug_set = set(slugs) if slugs is not None else None
        id_set = set(ids) if ids is not None else None
        rows = [
            t for t in self
            if (slug_set is None or t.slug in slug_set)
            and (id_set is None or t.id in id_set)
            and (env is None or t.env == env)
            and (predicate is None or predicate(t))
        ]
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._tasks = {t.slug: t for t in rows}
        return clone

    # -- files ----------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> Taskset:
        """Load rows from a ``.py`` module, a directory of them, a ``.json`` or a ``.jsonl`` file.

        A ``.py`` file is imported and scanned for ``Task`` objects (HUD v6 ``hud.eval.Task``
        rows too), ``Taskset`` objects and lists/tuples of tasks (a lone Taskset keeps its name).
        JSON is a list of rows or ``{"name": ..., "tasks": [...]}``; JSONL is one row per line.
        Rows written by HUD's ``Taskset.to_file`` load with every field kept.
        """
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"taskset file not found: {path}")
        if path.is_dir():  # every .py in it, as HUD's from_file(directory)
            files = [f for f in sorted(path.glob("*.py")) if f.stem not in _SKIP_STEMS]
            found = [t for f in files for t in _scan_module(f, required=False)[1]]
            if not found:
                raise ConfigError(f"{path}: no .py file in it defines a Task, Taskset or list of tasks")
            return cls(name or path.name, found)
        suffix = path.suffix.lower()
        if suffix == ".py":
            lone, rows = _scan_module(path)
            if lone is not None and len(lone) == len(rows) and isinstance(lone, cls):
                if name:
                    lone.name = name
                return lone  # keeps a subclass's resolve_task
            return cls(name or path.stem, rows)
        try:
            if suffix == ".json":
                data = json.loads(path.read_text())
                if isinstance(data, dict):
                    return cls(name or str(data.get("name") or path.stem), data.get("tasks", []))
                if isinstance(data, list):
                    return cls(name or path.stem, data)
                raise ConfigError(f"{path}: expected a list of tasks or an object with 'tasks'")
            if suffix == ".jsonl":
                lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
                return cls(name or path.stem, [json.loads(ln) for ln in lines])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
        raise ConfigError(f"unsupported taskset file {path}: use .py, .json or .jsonl")

    def to_file(self, path: str | Path) -> Path:
        """Write the rows as ``.json`` (a list) or ``.jsonl`` (one per line), as HUD v6 writes
        them: unset fields left out, every field a row carries (HUD's included) written, so
        ``hud.Taskset.from_file`` reads the file too."""
        path = Path(path)
        rows = [t.model_dump(mode="json", exclude_none=True) for t in self]
        if path.suffix.lower() == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif path.suffix.lower() == ".json":
            path.write_text(json.dumps(rows, indent=2) + "\n")
        else:
            raise ConfigError(f"to_file writes .json or .jsonl, not {path.suffix or path.name!r}")
        return path

    @classmethod
    async def replay(cls, source: Any, *, temporal: Any = None, name: str | None = None) -> Any:
        """A taskset of saved rollouts, for re-grading them without calling any agent.

        ``source``: a ``Job``, a ``jsonl`` export file (``Job.export``, ``rollouts export``) or a
        job id (read through Temporal: ``temporal`` is a Client or an address, None the usual
        default). ``await replay.run(runtime=...)`` then re-runs grade (and verify) on every
        saved answer in fresh sessions and returns the new Job; ``replay.skipped`` lists the
        rollouts without an answer, ``replay.compare(job)`` the old against the new rewards.
        """
        # A subclass of this class, so looked up by name (no import cycle between the modules).
        build = importlib.import_module(REPLAY).replay_taskset
        return await build(source, temporal=temporal, name=name)

    # -- running --------------------------------------------------------------------------

    async def run(self, agent: Agent, *, runtime: Any = None, group: int | None = None, max_concurrent: int = 16,
                  job: Job | None = None, rollout_timeout: float | None = None,
                  temporal: Any = None, retries: int = 0, on_error: str = "keep",
                  **kwargs: Any) -> Job:
        """Run every row ``group`` times with ``agent`` on ``runtime``, durably, and return the Job.

        ``group`` defaults to ``job.group`` when appending to an open job (``Job.start``), else 1.
        ``retries`` re-runs an errored or timed-out rollout fresh (new substrate, same group, the
        attempts recorded); ``on_error`` then decides about an error that is left: ``"keep"``
        (default), ``"drop_group"`` (the whole group gets ``dropped=True`` and leaves the stats)
        or ``"fail"`` (cancel the rest of the batch; every substrate is still torn down).
        ``runtime``: a built-in provider, or any ``(task) -> async context manager yielding a
        Runtime``; None serves each row from the env file that declares it, per rollout.
        ``epochs=N`` runs the rows N times, each epoch in its own order drawn from ``seed``
        (default 0); the rows then reach the batch as pages in storage, a window at a time.
        """
        # The durable executor is the Temporal layer: looked up by name when a batch runs, so
        # sdk/ never imports it (tests/test_layering.py) and plain imports never load Temporal.
        run_taskset = importlib.import_module(DURABLE_EXECUTOR).run_taskset
        runtime = resolve_placement(runtime, self)
        check_taskset_flags(self, group=Job.batch_group(group, job), runtime=runtime)
        return await run_taskset(  # type: ignore[no-any-return]
            self, agent, runtime=runtime, group=group,
            max_concurrent=max_concurrent, job=job, rollout_timeout=rollout_timeout, temporal=temporal, retries=retries,
            on_error=on_error, **kwargs,
        )


    async def start(self, agent: Agent, *, runtime: Any = None, group: int | None = None,
                    max_concurrent: int = 16, temporal: Any = None, max_in_flight: int | None = None,
                    max_staleness: int | None = None, on_error: str = "keep", retries: int = 0,
                    **kwargs: Any) -> Any:
        """Start every row ``group`` times durably and return a live job at once, for a trainer.

        ``async for batch in job.stream(consumer="trainer", batch_size=B)`` yields finished
        groups in completion order; ``await batch.ack()`` makes the acknowledgement durable (a
        restarted consumer of the same name gets every unacknowledged group again, never an
        acknowledged one). ``await job.set_policy(version, endpoint=...)``: new rollouts sample
        with it (``run.policy_version``). ``max_in_flight``: at most that many groups running or
        delivered but unacknowledged. ``max_staleness``: a group sampled more than that many
        policy versions behind is not delivered (re-sampled: ``on_stale="resample"``, default,
        or dropped). ``on_error="drop_sample"`` keeps a group without its failed members.
        More keyword arguments as for :meth:`run` and ``on_stale``, ``linger_s`` (how long the
        finished batch stays open for consumers that lag), ``policy_version``, ``worker``,
        ``epochs`` and ``seed`` (the rows N times, each epoch in its own order from the seed),
        ``page_size`` (groups every registered consumer acknowledged leave the batch's state in
        pages of this many, to ``ROLLOUTS_STORAGE``; default ``ROLLOUTS_STREAM_PAGE_SIZE``).

        ``job=<a running live job>`` adds these rows to that job instead (``LiveJob.add``): its
        agent, runtime and group run them, and its stream delivers them after the rows it has;
        only ``epochs`` and ``seed`` are this call's own (options of the job itself, like
        ``max_in_flight``, are one clear error). Returns that job.
        """
        job = kwargs.pop("job", None)
        if job is not None and callable(getattr(job, "add", None)):  # a LiveJob: further rows
            fixed = {"max_concurrent": max_concurrent != 16, "max_in_flight": max_in_flight is not None,
                     "max_staleness": max_staleness is not None, "on_error": on_error != "keep",
                     "retries": retries != 0}
            own = ("epochs", "seed", "worker", "task_queue")  # the live job already has its connection
            extra = [k for k, v in fixed.items() if v] + [k for k in kwargs if k not in own]
            kwargs = {k: v for k, v in kwargs.items() if k in ("epochs", "seed")}
            if extra:
                raise ConfigError(f"{', '.join(extra)}: set when job {job.id} started; rows added to it "
                                  "take only epochs= and seed=")
            await job.add(self, agent, runtime=runtime, group=group, **kwargs)
            return job
        if job is not None:
            kwargs["job"] = job
        start_live = importlib.import_module(LIVE_JOBS).start_live
        runtime = resolve_placement(runtime, self)
        check_taskset_flags(self, group=Job.batch_group(group, None), runtime=runtime)
        return await start_live(
            self, agent, runtime=runtime, group=group,
            max_concurrent=max_concurrent, temporal=temporal, max_in_flight=max_in_flight, max_staleness=max_staleness,
            on_error=on_error, retries=retries, **kwargs)


_SKIP_STEMS = frozenset({"conftest", "setup", "__init__", "__main__"})  # not tasks in a directory


def _longer_slug(task: Task, tasks: dict[str, Task]) -> Task:
    """``task`` with a longer default slug (16, then 40 hex digits of its args' hash) when only
    the 8 digits of its default one collide with an earlier, different row's; else ``task``."""
    other = tasks[task.slug]
    if task.slug != task_slug(task.id, task.args) or (other.id, other.args) == (task.id, task.args):
        return task  # a slug the row carries, or the same row twice: a duplicate
    for digits in (16, 40):
        longer = task.model_copy(update={"slug": task_slug(task.id, task.args, digits)})
        if longer.slug not in tasks:
            return longer
    return task


def _as_task(row: Any, source: str | None = None) -> Task:
    if isinstance(row, Task):
        return row
    if is_hud_task(row):  # a HUD v6 row: every field kept, source = its template's file
        return task_from_hud(row, source)
    if isinstance(row, dict):
        try:
            return Task.model_validate(row)
        except ValidationError as exc:
            raise ConfigError(f"invalid task row {row!r}: {exc}") from exc
    raise ConfigError(f"a taskset row must be a Task or a dict, not {type(row).__name__}")


def _is_row(value: Any) -> bool:
    return isinstance(value, Task) or is_hud_task(value)


def _scan_module(path: Path, required: bool = True) -> tuple[Taskset | None, list[Task]]:
    """Import ``path`` and collect its tasks (in definition order, identical rows once)."""
    from ..envserver.loader import import_file  # lazily: only a .py taskset needs it

    module_name = f"_rollouts_taskset_{path.stem}_{uuid.uuid4().hex[:8]}"
    try:  # tasks.py may `import env` next to it
        module = import_file(path.resolve(), module_name)
    except ConfigError:
        raise
    except Exception as exc:
        raise missing_hud(exc, str(path)) or ConfigError(
            f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    tasksets: list[Taskset] = []
    rows: list[Task] = []
    for value in vars(module).values():
        if isinstance(value, Taskset):
            tasksets.append(value)
            rows.extend(value)
        elif is_hud_taskset(value):
            rows.extend(_as_task(v, str(path)) for v in value)
        elif _is_row(value):
            rows.append(_as_task(value, str(path)))
        elif isinstance(value, (list, tuple)) and value and all(_is_row(v) for v in value):
            rows.extend(_as_task(v, str(path)) for v in value)
    unique: dict[str, Task] = {}
    for task in rows:
        seen = unique.get(task.slug)
        if seen is not None and seen != task:
            raise ConfigError(f"{path}: two different tasks share slug {task.slug!r}")
        unique.setdefault(task.slug, task)
    if not unique and required:
        raise ConfigError(f"{path} defines no Task, Taskset or list of tasks")
    return (tasksets[0] if len(tasksets) == 1 else None), list(unique.values())


# -- tasksets by class path: how a worker rebuilds a taskset whose resolve_task is overridden --

_LIVE: dict[tuple[str, str], Any] = {}


def taskset_class_path(taskset: Any) -> str | None:
    """``module:Class`` of a taskset whose ``resolve_task`` is overridden, else None (identity)."""
    if type(taskset).resolve_task is Taskset.resolve_task:
        return None
    cls = type(taskset)
    return f"{cls.__module__}:{cls.__qualname__}"


def register_taskset(taskset: Any) -> None:
    """Let an in-process worker resolve with the caller's live taskset object."""
    path = taskset_class_path(taskset)
    if path is not None:
        _LIVE[(path, taskset.name)] = taskset


def load_taskset(path: str, name: str) -> Any:
    """The taskset a worker resolves with: the caller's live object, else ``Class(name)`` by path."""
    live = _LIVE.get((path, name))
    if live is not None:
        return live
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = import_path(module_name, qualname)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import taskset class {path!r} on this worker: {err}") from err
    try:
        return obj(name)
    except TypeError as err:
        raise ConfigError(f"taskset class {path!r} cannot be built as {qualname}(name): {err}") from err
