"""``rollouts regrade``: load the saved rollouts, start the re-grade, follow it, compare rewards.

Runs a worker in this process with the embedded dev server (or ``--worker``), like ``run``;
with ``--temporal`` the running workers re-grade. Returns the exit code: 0 every re-graded
rollout succeeded, 1 some did not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from durable_rollouts.cli import render
from durable_rollouts.cli.batch import announce, ui_base
from durable_rollouts.cli.output import check_output, write_runs
from durable_rollouts.cli.progress import follow
from durable_rollouts.temporal.jobs import connect

__all__ = ["RegradeOptions", "regrade_job"]

SHOWN_CHANGES = 20  # changed rollouts listed in the text summary (--json lists all)


@dataclass
class RegradeOptions:
    source: str
    grader: str | None = None
    runtime: str | None = None
    name: str | None = None
    max_concurrent: int = 16
    temporal: str | None = None
    worker: bool | None = None
    connect_timeout: float = 5.0
    as_json: bool = False
    output: str | None = None
    export_format: str = "jsonl"


async def _load(opts: RegradeOptions) -> tuple[Any, Any]:
    """(the client, the ReplayTaskset of ``opts.source``): a file is read before connecting."""
    from ..sdk.replay import is_export_path, replay_taskset

    if is_export_path(opts.source):
        replay = await replay_taskset(opts.source, name=opts.name)
        return await connect(opts.temporal, opts.connect_timeout), replay
    client = await connect(opts.temporal, opts.connect_timeout)
    return client, await replay_taskset(opts.source, temporal=client, name=opts.name)


async def regrade_job(opts: RegradeOptions, out: Console, err: Console) -> int:
    from durable_rollouts.temporal.connection import resolve_address

    from .specs import add_cwd_to_path, check_sources, parse_runtime

    check_output(opts.output, opts.as_json, opts.export_format)
    runtime = parse_runtime(opts.runtime) if opts.runtime is not None else None
    client, replay = await _load(opts)
    if runtime is None and replay.runtime_spec is None and opts.grader is None:
        runtime = parse_runtime("local")  # an export file names no runtime: as `rollouts run`
    replay, runtime = replay.for_grading(runtime, opts.grader)
    check_sources(replay, runtime)
    add_cwd_to_path()
    embedded = resolve_address(opts.temporal) is None
    handles = await replay.run(
        runtime=runtime, max_concurrent=opts.max_concurrent, temporal=client, name=opts.name,
        worker=embedded if opts.worker is None else opts.worker,
        wait=False)
    job = handles[0].job
    announce(err, job.id, f"re-grading {len(replay.rollouts)} rollouts of {opts.source} "
             f"({len(replay.skipped)} skipped), runtime {runtime.spec().kind}",
             ui_base(opts.temporal))
    try:  # the handles come in the order of replay.batches()
        for index, (handle, batch) in enumerate(zip(handles, replay.batches())):
            label = "re-grading" if len(handles) == 1 else f"batch {index}"
            await follow(handle.handle, err, total=len(batch.rows) * batch.group, label=label)
            await handle.wait()
    finally:
        for handle in handles:
            await handle.release()
    summary = replay.compare(job)
    if opts.output is not None:
        write_runs(job.runs, opts.output, opts.export_format, job.agent)
        if opts.output == "-":
            out = Console(stderr=True, markup=False, highlight=False, width=out.width)
    if opts.as_json:
        out.print_json(json.dumps({**summary.to_dict(), "source": opts.source, "name": job.name,
                                   "counts": render.status_counts(job.runs)}))
    else:
        _print_summary(out, summary, opts.source)
    return 0 if all(run.status == "succeeded" for run in job.runs) else 1


def _print_summary(out: Console, summary: Any, source: str) -> None:
    fmt = (lambda v: "-" if v is None else f"{v:.3f}")
    changed = summary.changed
    out.print(summary.job_id, highlight=False)
    out.print(f"re-graded {len(summary.rollouts)} rollouts of {source}: {len(changed)} rewards "
              f"changed, {len(summary.rollouts) - len(changed)} unchanged; mean reward "
              f"{fmt(summary.old_reward)} -> {fmt(summary.new_reward)} (succeeded only)",
              highlight=False)
    for change in changed[:SHOWN_CHANGES]:
        out.print(f"  {change.source_rollout_id}: {fmt(change.old_reward)} ({change.old_status}) -> "
                  f"{fmt(change.new_reward)} ({change.new_status})", highlight=False)
    if len(changed) > SHOWN_CHANGES:
        out.print(f"  ... and {len(changed) - SHOWN_CHANGES} more (--json lists every rollout)",
                  highlight=False)
    if summary.skipped:
        out.print(f"skipped {len(summary.skipped)} rollout(s):", highlight=False)
        for saved in summary.skipped[:SHOWN_CHANGES]:
            out.print(f"  {saved.rollout_id}: {saved.skip_reason}", highlight=False)
        if len(summary.skipped) > SHOWN_CHANGES:
            out.print(f"  ... and {len(summary.skipped) - SHOWN_CHANGES} more (--json lists them)",
                      highlight=False)
