"""Formatting for the CLI: per-task summaries, rollout and job tables, traces, export records.

Pure functions over ``Run`` objects (and the small views of ``temporal.jobs``): numbers are
computed in plain dicts (what ``--json`` prints) and turned into rich tables separately. No I/O.
Rewards follow ``Run.reward``: only succeeded runs have one, and dropped groups' runs are left
out of every mean and spread (they still count as runs and failures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from rich.table import Table
from rich.text import Text

from ..sdk.export_formats import jsonl_record

__all__ = [
    "dropped_groups",
    "export_record",
    "jobs_table",
    "mean_reward",
    "policy_lines",
    "rollout_table",
    "status_counts",
    "summary_table",
    "task_summary",
    "totals_line",
    "trace_text",
    "ui_link",
]

_NOT_FAILED = frozenset(
    {"succeeded", "running", "waiting", "pending", "cancelling"}
)  # in flight is not failed


def ui_link(ui_base: str | None, job_id: str, namespace: str = "default") -> str | None:
    """The Web UI page listing the job's workflows (batches and rollouts)."""
    if not ui_base:
        return None
    query = quote(f'RolloutsJobId="{job_id}"', safe="")
    return f"{ui_base.rstrip('/')}/namespaces/{namespace}/workflows?query={query}"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _std(values: list[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def status_counts(runs: Iterable[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in runs:
        out[run.status] = out.get(run.status, 0) + 1
    return dict(sorted(out.items()))


def task_summary(runs: Iterable[Any]) -> list[dict[str, Any]]:
    """Per task slug: runs, graded, mean reward, within-group spread (largest group std), failures
    (finished without success; rollouts still in flight do not count).

    ``zero_spread`` is True when some group has two or more graded runs that all got the same
    reward: such a group gives a trainer no signal.
    """
    by_slug: dict[str, list[Any]] = {}
    for run in runs:
        by_slug.setdefault(run.slug, []).append(run)
    rows = []
    for slug, task_runs in by_slug.items():
        rewards = [r.reward for r in task_runs if _counted(r)]
        groups: dict[str, list[float]] = {}
        for r in task_runs:
            if _counted(r):
                groups.setdefault(r.group_id, []).append(r.reward)
        spreads = [s for s in (_std(v) for v in groups.values()) if s is not None]
        zero = [gid for gid, v in groups.items() if len(v) >= 2 and _std(v) == 0.0]
        rows.append(
            {
                "slug": slug,
                "runs": len(task_runs),
                "graded": len(rewards),
                "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                "spread": max(spreads) if spreads else None,
                "failures": sum(1 for r in task_runs if r.status not in _NOT_FAILED),
                "errored": sum(1 for r in task_runs if r.status == "errored"),
                "dropped": sum(1 for r in task_runs if getattr(r, "dropped", False)),
                "zero_spread": bool(zero),
                "zero_spread_groups": zero,
            }
        )
    return rows


def _counted(run: Any) -> bool:
    return run.reward is not None and not getattr(run, "dropped", False)


def mean_reward(runs: Iterable[Any]) -> float | None:
    """Mean over the runs whose reward counts (succeeded, not dropped); None if there are none."""
    rewards = [r.reward for r in runs if _counted(r)]
    return sum(rewards) / len(rewards) if rewards else None


def dropped_groups(runs: Iterable[Any]) -> list[str]:
    """Group ids dropped by ``on_error=drop_group``, in order."""
    return list(dict.fromkeys(r.group_id for r in runs if getattr(r, "dropped", False)))


_FAIL_MARK = "on_error=fail stopped the batch after "


def policy_lines(runs: list[Any], batches: list[tuple[str, str, list[Any]]]) -> list[str]:
    """Notes on the batch policies: the dropped groups, and for each ``(workflow id, on_error,
    runs)`` batch stopped by ``on_error=fail`` the rollout that stopped it."""
    lines = []
    dropped = dropped_groups(runs)
    if dropped:
        lines.append(f"{len(dropped)} dropped group(s) (on_error=drop_group; exported with "
                     f"dropped: true, left out of the stats): {', '.join(dropped)}")
    for wf_id, on_error, batch_runs in batches:
        marks = [r.error for r in batch_runs if on_error == "fail" and r.error and _FAIL_MARK in r.error]
        if marks:
            culprit = marks[0].split(_FAIL_MARK, 1)[1].removesuffix(" failed")
            lines.append(f"batch {wf_id} stopped by on_error=fail after {culprit} failed")
    return lines


def summary_table(rows: list[dict[str, Any]], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("task", "left"),
        ("runs", "right"),
        ("mean reward", "right"),
        ("spread", "right"),
        ("failures", "right"),
        ("", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        note = Text("zero spread", style="yellow") if row["zero_spread"] else Text("")
        fails = Text(str(row["failures"]), style="red" if row["failures"] else "")
        table.add_row(
            row["slug"],
            str(row["runs"]),
            _fmt(row["mean_reward"]),
            _fmt(row["spread"]),
            fails,
            note,
        )
    return table


def totals_line(runs: list[Any]) -> str:
    """Counts per status (errored ones on their own), the dropped ones, and the mean reward over
    succeeded, kept runs only."""
    counts = status_counts(runs)
    mean = _fmt(mean_reward(runs))
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    dropped = sum(1 for r in runs if getattr(r, "dropped", False))
    note = f" ({dropped} in dropped groups)" if dropped else ""
    return (f"{len(runs)} rollouts: {parts or 'none'}{note}; "
            f"mean reward {mean} (succeeded rollouts only)")


def _short(text: str | None, width: int = 70) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "errored": "red",
    "timeout": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "waiting": "dim",  # for fleet-wide admission
    "pending": "dim",
    "cancelling": "yellow",
}


def rollout_table(runs: list[Any], zero_spread_groups: set[str] | None = None) -> Table:
    zero = zero_spread_groups or set()
    table = Table(title="rollouts", title_justify="left")
    for name, justify in (
        ("#", "right"),
        ("rollout", "left"),
        ("status", "left"),
        ("reward", "right"),
        ("attempts", "right"),
        ("phase", "left"),
        ("error", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, run in enumerate(runs):
        label = f"{run.slug} #{run.group_index}" + (" *" if run.group_id in zero else "")
        if getattr(run, "dropped", False):
            label += " (dropped)"
        retries = getattr(run, "retries", 0)
        table.add_row(
            str(i),
            label,
            Text(run.status, style=_STATUS_STYLE.get(run.status, "")),
            _fmt(run.reward),
            str(run.attempts) + (f" +{retries} retries" if retries else ""),
            run.error_phase or "",
            _short(run.error),
        )
    if zero:
        table.caption = "* group with zero reward spread (no learning signal)"
        table.caption_justify = "left"
    return table


def _when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def jobs_table(jobs: list[Any]) -> Table:
    table = Table()
    table.add_column("job id", no_wrap=True)
    for name in ("name", "taskset", "agent", "status", "batches", "started", "closed"):
        table.add_column(name, overflow="fold")
    for job in jobs:
        table.add_row(
            job.job_id,
            job.name,
            job.taskset,
            job.agent,
            Text(job.status, style=_STATUS_STYLE.get(job.status, "")),
            str(job.batches),
            _when(job.started_at),
            _when(job.closed_at),
        )
    return table


def export_record(run: Any) -> dict[str, Any]:
    """One JSONL line of ``rollouts export`` (``sdk.export_formats.jsonl_record``)."""
    return jsonl_record(run)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content blocks: keep their text
        content = "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    text = _text(content) if content is not None else ""
    calls = message.get("tool_calls")
    if calls:
        text += ("\n" if text else "") + "tool calls: " + _text(calls)
    return text


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines() or [""])


def trace_text(run: Any) -> str:
    """A readable rendering of one rollout: header, every step, the answer and the grade."""
    lines = [
        f"rollout {run.rollout_id}",
        f"task    {run.slug}" + (f"  args {_text(run.task.args)}" if run.task else ""),
        f"status  {run.status}  reward {_fmt(run.reward)}  attempts {run.attempts}"
        + ("  (dropped group)" if getattr(run, "dropped", False) else ""),
    ]
    if run.error:
        lines.append(f"error   [{run.error_phase or '-'}] {run.error}")
    trace = run.trace
    if not trace.steps and trace.content is None:
        lines.append("(no trace recorded)")
    for step in trace.steps:
        head = f"[{step.index}] {step.source}"
        if step.ended_at is not None and step.ended_at - step.started_at >= 0.005:
            head += f"  {step.ended_at - step.started_at:.2f}s"
        lines.append("")
        lines.append(head)
        if step.task_call is not None:
            call = step.task_call
            lines.append(_indent(f"{call.phase} {call.name}({_text(call.arguments)})"))
            if call.result is not None:
                lines.append(_indent("-> " + _text(call.result)))
        for message in step.messages:
            role = message.get("role", "?")
            lines.append(_indent(f"{role}: {_content(message)}"))
        if step.error:
            lines.append(_indent(f"error: {step.error}"))
    lines.append("")
    lines.append(f"answer: {trace.content if trace.content is not None else '-'}")
    if run.grade is not None:
        extra = f"  info {_text(run.grade.info)}" if run.grade.info else ""
        err = "  (grade error)" if run.grade.is_error else ""
        lines.append(f"grade:  {_fmt(run.grade.reward)}{err}{extra}")
        if run.grade.content:
            lines.append(_indent(run.grade.content))
    return "\n".join(lines)
