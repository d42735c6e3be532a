"""Saved rollouts: what a re-grade needs of a finished rollout, read from a Job or an export file.

A :class:`SavedRollout` is one finished rollout as a re-grade sees it: its ids, the task it ran
(as resolved: id and args from the trace's setup step, where ``Taskset.resolve_task`` may have
changed them), its old outcome, and its trace, whose ``content`` is the final answer to re-grade.
It comes from a ``Run`` (:func:`from_run`: a ``Job`` in memory or loaded from Temporal by the
Temporal layer) or from a line of ``Job.export(path, "jsonl")`` / ``rollouts export -o FILE``
(:func:`read_export`). Imports models, errors and the trace store only; never Temporal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..models import Task, Trace
from .run import Run

__all__ = ["SavedRollout", "from_record", "from_run", "ran_task", "read_export"]


@dataclass(frozen=True)
class SavedRollout:
    """One finished rollout to re-grade.

    Attributes:
        trace_uri: where its trace is stored (a ``rollouts-storage:`` or ``file://`` uri), if known.
        reward: its old reward (None unless it succeeded); ``grade_reward`` its grade's, whatever
            the status.
    """

    job_id: str
    rollout_id: str
    group_id: str
    group_index: int
    task: Task | None
    status: str
    reward: float | None = None
    grade_reward: float | None = None
    error: str | None = None
    error_phase: str | None = None
    trace: Trace | None = None
    trace_uri: str | None = None
    trace_lost: bool = False  # it had a stored trace that could not be read

    @property
    def answer(self) -> str | None:
        """The final answer the agent left (None when it left none)."""
        return self.trace.content if self.trace is not None else None

    @property
    def skip_reason(self) -> str | None:
        """Why this rollout cannot be re-graded, or None when it can."""
        if self.task is None:
            return "its task is not known"
        if self.status in ("running", "waiting", "pending", "cancelling"):
            return f"it has not finished ({self.status})"
        if self.trace_lost:
            return "its trace could not be read from storage"
        if self.answer is None:
            where = f" in {self.error_phase}" if self.error_phase else ""
            why = f": {self.error}" if self.error else ""
            return f"no answer to re-grade (it {self.status}{where}{why})"
        return None


def ran_task(row: Task | None, trace: Trace | None) -> Task | None:
    """The task a rollout ran: ``row`` with the id and args its trace's setup step recorded
    (``resolve_task`` may have bound other ones than the row's)."""
    if row is None or trace is None or not trace.steps:
        return row
    call = trace.steps[0].task_call
    if call is None or call.phase != "setup" or (call.name, call.arguments) == (row.id, row.args):
        return row
    return row.model_copy(update={"id": call.name, "args": dict(call.arguments)})


def from_run(run: Run, job_id: str | None = None) -> SavedRollout:
    """A finished run (with its trace loaded, as ``Job.runs`` and ``load_job(traces=True)`` have
    it) as a saved rollout."""
    loaded = bool(run.trace.steps) or run.trace.content is not None
    return SavedRollout(
        job_id=job_id or run.job_id, rollout_id=run.rollout_id, group_id=run.group_id,
        group_index=run.group_index, task=ran_task(run.task, run.trace), status=run.status,
        reward=run.reward, grade_reward=run.grade_reward, error=run.error,
        error_phase=run.error_phase, trace=run.trace if loaded else None,
        trace_uri=run.trace_ref.uri if run.trace_ref is not None else None,
        trace_lost=run.trace_ref is not None and not loaded,
    )


_REQUIRED = ("rollout_id", "group_id", "group_index", "status", "trace")


def _record_task(record: dict[str, Any]) -> Task | None:
    row = record.get("task")
    if isinstance(row, dict):
        return Task.model_validate(row)
    if record.get("task_id") is None or record.get("env") is None:
        return None
    return Task(env=record["env"], id=record["task_id"], args=record.get("args") or {})


def from_record(record: dict[str, Any]) -> SavedRollout:
    """A line of a ``jsonl`` export as a saved rollout (ValueError when it is not one)."""
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        raise ValueError(f"it has no {', '.join(missing)} (export it with --format jsonl)")
    trace = Trace.model_validate(record["trace"]) if record["trace"] is not None else None
    grade = record.get("grade") if isinstance(record.get("grade"), dict) else None
    grade_reward = None if grade is None or grade.get("is_error") else grade.get("reward")
    return SavedRollout(
        job_id=str(record.get("job_id") or ""), rollout_id=str(record["rollout_id"]),
        group_id=str(record["group_id"]), group_index=int(record["group_index"]),
        task=ran_task(_record_task(record), trace), status=str(record["status"]),
        reward=record.get("reward"), grade_reward=grade_reward, error=record.get("error"),
        error_phase=record.get("error_phase"), trace=trace,
    )


def read_export(path: str | Path) -> list[SavedRollout]:
    """The rollouts of a ``jsonl`` export file, one per line.

    Raises:
        ConfigError: the file is missing, or a line is not a ``jsonl`` export record.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"export file not found: {path}")
    if file.suffix.lower() != ".jsonl":
        raise ConfigError(f"{path}: replay reads a `rollouts export --format jsonl` file (.jsonl)")
    saved = []
    with file.open() as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                saved.append(from_record(record if isinstance(record, dict) else {}))
            except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigError(f"{path} line {number} is not a rollout record: {first}") from None
    if not saved:
        raise ConfigError(f"{path} holds no rollouts")
    return saved
