"""Seed 003's deriving replay taskset: new tasks derived lazily from saved rollouts.

A subclass of :class:`DerivedTaskset` implements two hooks:

* ``record_anchors(saved) -> list``: the resume points one saved rollout offers (default: one,
  ``None``, the whole rollout);
* ``build_prompt(saved, anchor) -> Task``: the task that resumes from one anchor (for instance
  the saved conversation up to it, as the row's args).

Rows are light stubs, one per (saved rollout, anchor); ``resolve_task`` (once per group, so a
group's members share one derived task) calls ``build_prompt`` then, not before. Every row and
derived task carries its lineage in ``columns["lineage"]`` (the source job, rollout, anchor,
which must be a JSON value, and depth), and a rollout that was itself derived is not derived
again unless ``chain=True``. Imports the
sdk's taskset and saved-rollout modules only.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models import Task
from .saved_rollouts import SavedRollout, from_run, read_export
from .taskset import Taskset

__all__ = ["DerivedTaskset", "lineage"]

LINEAGE = "lineage"


def lineage(task: Task | None) -> dict[str, Any] | None:
    """The lineage a derived task carries (None for a task that was not derived)."""
    found = (task.columns or {}).get(LINEAGE) if task is not None else None
    return found if isinstance(found, dict) else None


class DerivedTaskset(Taskset):
    """Tasks derived from saved rollouts (a ``Job`` or a ``jsonl`` export file).

    Args:
        source: a finished ``Job`` (its runs with traces), a ``jsonl`` export path, or a list
            of ``SavedRollout``.
        name: the taskset's name (default: the class name).
        chain: derive from rollouts that were themselves derived too (default: skip them).
        min_reward: only rollouts whose reward is at least this (default: every finished one
            with an answer).

    Raises:
        ConfigError: no saved rollout offers an anchor.
    """

    def __init__(self, source: Any, *, name: str | None = None, chain: bool = False,
                 min_reward: float | None = None) -> None:
        saved = _saved(source)
        self._sources: dict[str, tuple[SavedRollout, Any, int]] = {}
        stubs: list[Task] = []
        for rollout in saved:
            if rollout.task is None or rollout.answer is None:
                continue
            if min_reward is not None and (rollout.reward is None or rollout.reward < min_reward):
                continue
            parent = lineage(rollout.task)
            if parent is not None and not chain:
                continue
            depth = int(parent.get("depth", 0)) + 1 if parent else 1
            for anchor in self.record_anchors(rollout):
                slug = f"{rollout.task.slug}-d{len(stubs)}"
                stamp = {"job_id": rollout.job_id, "rollout_id": rollout.rollout_id,
                         "anchor": anchor, "depth": depth, "taskset": name or type(self).__name__}
                stubs.append(_stamped(rollout.task.model_copy(update={"slug": slug}), stamp))
                self._sources[slug] = (rollout, anchor, depth)
        if not stubs:
            raise ConfigError(f"{type(self).__name__}: no saved rollout offers an anchor to derive "
                              "from (derived ones are skipped unless chain=True)")
        super().__init__(name or type(self).__name__, stubs)

    # -- the hooks ----------------------------------------------------------------------------

    def record_anchors(self, saved: SavedRollout) -> list[Any]:
        """The resume points ``saved`` offers (default: the whole rollout, once)."""
        return [None]

    def build_prompt(self, saved: SavedRollout, anchor: Any) -> Task:
        """The task resuming ``saved`` at ``anchor`` (sync or ``async def``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_prompt")

    # -- lazy resolution ----------------------------------------------------------------------

    async def resolve_task(self, task: Task) -> Task:  # type: ignore[override]
        """Build the derived task of a stub (once per group) and stamp its lineage."""
        found = self._sources.get(task.slug)
        if found is None:  # not one of ours (a row added by a subclass): as it is
            return task
        saved, anchor, _ = found
        built = self.build_prompt(saved, anchor)
        if inspect.isawaitable(built):
            built = await built
        if not isinstance(built, Task):
            raise ConfigError(f"{type(self).__name__}.build_prompt returned "
                              f"{type(built).__name__}, not a Task")
        return _stamped(built, lineage(task) or {})

    def source_of(self, task: Task) -> SavedRollout | None:
        """The saved rollout a row (stub) derives from."""
        found = self._sources.get(task.slug)
        return found[0] if found else None


def _stamped(task: Task, stamp: dict[str, Any]) -> Task:
    return task.model_copy(update={"columns": {**(task.columns or {}), LINEAGE: stamp}})


def _saved(source: Any) -> list[SavedRollout]:
    if isinstance(source, (str, Path)):
        return read_export(source)
    runs = getattr(source, "runs", None)
    if runs is not None:  # a Job
        return [from_run(run, getattr(source, "id", None)) for run in runs]
    if isinstance(source, list) and all(isinstance(s, SavedRollout) for s in source):
        return list(source)
    raise ConfigError(f"derive from a Job, a jsonl export path or SavedRollouts, not "
                      f"{type(source).__name__}")
