"""``rollouts jobs``, ``show``, ``cancel``, ``export`` and ``trace``: look at and stop jobs.

Each returns the exit code. Reads jobs through ``temporal.jobs``; prints with ``cli.render``.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from durable_rollouts.cli import render
from durable_rollouts.temporal.control import cancel_job, list_jobs
from durable_rollouts.temporal.job_summary import summarize_job
from durable_rollouts.temporal.jobs import connect, load_job

from ..errors import ConfigError
from .batch import ui_base
from .output import job_json, policy_notes, write_export
from .summary import show_summary

__all__ = ["cancel", "export", "find_run", "jobs", "show", "trace"]


async def jobs(
    out: Console,
    *,
    status: str | None,
    limit: int,
    temporal: str | None,
    as_json: bool,
    connect_timeout: float,
) -> int:
    if limit < 1:
        raise ConfigError(f"--limit must be at least 1, not {limit}")
    client = await connect(temporal, connect_timeout)
    found = await list_jobs(client, status=status, limit=limit)
    if as_json:
        out.print_json(json.dumps([j.to_dict() for j in found]))
    elif not found:
        out.print("no jobs" + (f" with status {status}" if status else ""), highlight=False)
    else:
        out.print(render.jobs_table(found))
    return 0


SHOW_EVERY_ROLLOUT = 2_000  # above this, `show` prints the counters and the latest rollouts


async def show(
    out: Console, job_id: str, *, temporal: str | None, as_json: bool, connect_timeout: float,
    every: bool = False,
) -> int:
    client = await connect(temporal, connect_timeout)
    if not every and not as_json:
        summary = await summarize_job(client, job_id)
        if summary.rollouts > SHOW_EVERY_ROLLOUT:
            show_summary(out, summary, ui_base(temporal))
            return 0
    view = await load_job(client, job_id)
    ui = ui_base(temporal)
    if as_json:
        out.print_json(json.dumps(job_json(view, ui)))
        return 0
    first = view.batches[0].input
    out.print(f"job      {view.job_id}  ({view.name})", highlight=False)
    out.print(f"status   {view.status}", highlight=False)
    out.print(
        f"taskset  {first.taskset_name}: {len(view.batches[0].rows)} tasks x group {first.group}",
        highlight=False,
    )
    out.print(
        f"agent    {first.agent.path} {json.dumps(first.agent.config) if first.agent.config else ''}",
        highlight=False,
    )
    out.print(f"runtime  {first.provider.kind}", highlight=False)
    for batch in view.batches:
        closed = batch.closed_at.isoformat(timespec="seconds") if batch.closed_at else "-"
        started = batch.started_at.isoformat(timespec="seconds") if batch.started_at else "-"
        out.print(
            f"batch    {batch.workflow_id}: {batch.status} (started {started}, closed {closed})",
            highlight=False,
        )
    link = render.ui_link(ui, view.job_id)
    if link:
        out.print(f"Web UI   {link}", highlight=False, soft_wrap=True)
    runs = view.runs
    summary = render.task_summary(runs)
    zero = {gid for row in summary for gid in row["zero_spread_groups"]}
    out.print(render.summary_table(summary, title="tasks"))
    out.print(render.rollout_table(runs, zero))
    if zero:
        out.print(
            f"{len(zero)} group(s) with zero reward spread: they teach a trainer nothing",
            highlight=False,
        )
    out.print(render.totals_line(runs), highlight=False)
    policy_notes(view, out)
    return 0


async def cancel(
    out: Console, job_id: str, *, temporal: str | None, wait_s: float, connect_timeout: float
) -> int:
    client = await connect(temporal, connect_timeout)
    outcome = await cancel_job(client, job_id, wait_s=wait_s)
    if not outcome.cancelled:
        out.print(f"job {outcome.job_id} is not running; nothing to cancel", highlight=False)
        return 0
    out.print(f"cancelled job {outcome.job_id} ({', '.join(outcome.cancelled)})", highlight=False)
    if outcome.still_running:
        out.print(
            f"{outcome.still_running} rollout(s) are still tearing down their substrates",
            highlight=False,
        )
    else:
        out.print("every rollout has closed and torn down its substrate", highlight=False)
    out.print(
        f"re-run the cancelled rollouts later with: rollouts resume {outcome.job_id}",
        highlight=False,
    )
    return 0


async def export(
    out: Console,
    job_id: str,
    output: str,
    *,
    temporal: str | None,
    connect_timeout: float,
    export_format: str = "jsonl",
) -> int:
    from ..sdk.export_formats import check_format

    check_format(export_format)
    client = await connect(temporal, connect_timeout)
    view = await load_job(client, job_id, traces=True)
    count = write_export(view, output, export_format)
    if output != "-":
        out.print(f"wrote {count} runs of job {view.job_id} to {output}", highlight=False)
    return 0


def find_run(runs: list[Any], key: str) -> Any:
    """A run by full rollout id, by ``#N`` / ``N`` (its row in `show`), or by a unique id suffix/substring."""
    bare = key.lstrip("#")
    if bare.isdigit() and int(bare) < len(runs) and not any(r.rollout_id == key for r in runs):
        return runs[int(bare)]
    for run in runs:
        if run.rollout_id == key:
            return run
    matches = [r for r in runs if r.rollout_id.endswith(key)] or [
        r for r in runs if key in r.rollout_id
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigError(
            f"no rollout {key!r} in this job (see the ids with `rollouts show JOB --json`)"
        )
    raise ConfigError(f"{key!r} matches {len(matches)} rollouts; give more of the id")


async def trace(
    out: Console,
    job_id: str,
    rollout: str,
    *,
    temporal: str | None,
    as_json: bool,
    connect_timeout: float,
) -> int:
    client = await connect(temporal, connect_timeout)
    view = await load_job(client, job_id, traces=True)
    run = find_run(view.runs, rollout)
    if as_json:
        out.print_json(json.dumps(render.export_record(run), default=str))
    else:
        out.print(render.trace_text(run), highlight=False, markup=False, soft_wrap=True)
    return 0
