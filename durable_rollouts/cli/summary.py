"""``rollouts show`` on a long job: its counters and latest rollouts, not every one of them."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from durable_rollouts.cli import render
from durable_rollouts.temporal.job_summary import BatchSummary, JobSummary

__all__ = ["show_summary"]

_SOURCE = {
    "result": "final",
    "query": "live",
    "carried": "as of the batch's last continue-as-new (no worker answered)",
}


def _counts(batch: BatchSummary) -> str:
    p = batch.progress
    parts = [f"{n} {name}" for name, n in (
        ("running", p.running), ("succeeded", p.succeeded), ("failed", p.failed),
        ("errored", p.errored), ("timeout", p.timeout), ("cancelled", p.cancelled)) if n]
    mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    return (f"{p.finished} of {batch.rollouts} finished ({', '.join(parts) or 'none yet'}); "
            f"mean reward {mean}; {p.runs} workflow run(s); counters {_SOURCE[batch.progress_source]}")


def _latest_table(batch: BatchSummary) -> Table:
    table = Table(title=f"batch {batch.index}: latest {len(batch.latest)} finished rollouts")
    for column in ("rollout", "row", "member", "status", "reward", "attempts", "error"):
        table.add_column(column)
    for r in batch.latest:
        reward = "-" if r.reward is None else f"{r.reward:.3f}"
        error = (r.error or "")[:60]
        table.add_row(r.rollout_id, str(r.row_index), str(r.group_index), r.status, reward,
                      str(r.attempts), error)
    return table


def show_summary(out: Console, summary: JobSummary, ui: str | None) -> None:
    """Print a long job by its counters: cost independent of the number of rollouts."""
    first = summary.batches[0].input
    out.print(f"job      {summary.job_id}  ({first.job_name or summary.job_id})", highlight=False)
    out.print(f"status   {summary.status}", highlight=False)
    out.print(f"taskset  {first.taskset_name}: {summary.batches[0].rows} rows x group "
              f"{first.group}", highlight=False)
    agent_config = json.dumps(first.agent.config) if first.agent.config else ""
    out.print(f"agent    {first.agent.path} {agent_config}", highlight=False)
    out.print(f"runtime  {first.provider.kind}", highlight=False)
    for batch in summary.batches:
        started = batch.started_at.isoformat(timespec="seconds") if batch.started_at else "-"
        closed = batch.closed_at.isoformat(timespec="seconds") if batch.closed_at else "-"
        out.print(f"batch    {batch.workflow_id}: {batch.status} (started {started}, closed "
                  f"{closed})", highlight=False)
        out.print(f"         {_counts(batch)}", highlight=False)
    link = render.ui_link(ui, summary.job_id)
    if link:
        out.print(f"Web UI   {link}", highlight=False, soft_wrap=True)
    for batch in summary.batches:
        if batch.latest:
            out.print(_latest_table(batch))
    out.print(f"{summary.rollouts} rollouts: more than this view lists one by one; every rollout "
              f"with `rollouts show {summary.job_id} --all`, or to a file with "
              f"`rollouts export {summary.job_id} -o FILE`", highlight=False)
