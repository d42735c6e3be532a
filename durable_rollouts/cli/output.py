"""What the CLI writes about a job: its JSON summary, exported run lines, policy notes, and the
checks of ``-o``/``--json``/``--format`` before anything starts. Shared by ``run``, ``regrade`` and
the views (``show``, ``export``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import ConfigError
from ..temporal.jobs import JobView
from . import render

__all__ = ["check_output", "job_json", "policy_notes", "write_export", "write_runs"]


def policy_notes(view: JobView, out: Console) -> None:
    """Print which groups ``drop_group`` left out and which rollout made ``fail`` stop a batch."""
    batches = [(b.workflow_id, b.input.on_error, b.runs) for b in view.batches]
    for line in render.policy_lines(view.runs, batches):
        out.print(line, highlight=False)


def job_json(view: JobView, ui: str | None) -> dict[str, Any]:
    runs = view.runs
    first = view.batches[0].input
    return {
        "job_id": view.job_id,
        "name": view.name,
        "status": view.status,
        "taskset": first.taskset_name,
        "agent": first.agent.path,
        "runtime": first.provider.kind,
        "group": first.group,
        "batches": [
            {
                "workflow_id": b.workflow_id,
                "status": b.status,
                "started_at": b.started_at.isoformat() if b.started_at else None,
                "closed_at": b.closed_at.isoformat() if b.closed_at else None,
            }
            for b in view.batches
        ],
        "ui": render.ui_link(ui, view.job_id),
        "counts": render.status_counts(runs),
        "reward": render.mean_reward(runs),
        "retries": first.retries,
        "on_error": first.on_error,
        "dropped_groups": render.dropped_groups(runs),
        "tasks": render.task_summary(runs),
        "rollouts": [
            {
                "rollout_id": r.rollout_id,
                "slug": r.slug,
                "group_id": r.group_id,
                "group_index": r.group_index,
                "status": r.status,
                "reward": r.reward,
                "grade_reward": r.grade_reward,
                "dropped": r.dropped,
                "attempts": r.attempts,
                "retries": r.retries,
                "error_phase": r.error_phase,
                "error": r.error,
            }
            for r in runs
        ],
    }


def write_export(view: JobView, output: str, export_format: str = "jsonl") -> int:
    """Write the job's runs as ``export_format`` lines to ``output`` ('-' = stdout)."""
    return write_runs(view.runs, output, export_format, view.batches[0].input.agent)


def write_runs(runs: list[Any], output: str, export_format: str = "jsonl", agent: Any = None) -> int:
    """Write ``runs`` as ``export_format`` lines to ``output`` ('-' = stdout); how many."""
    from ..sdk.export_formats import records

    lines = [
        json.dumps(rec, default=str, ensure_ascii=False) + "\n"
        for rec in records(runs, export_format, agent)
    ]
    if output == "-":
        sys.stdout.write("".join(lines))
    else:
        path = Path(output)
        if path.parent and not path.parent.exists():
            raise ConfigError(f"output folder does not exist: {path.parent}")
        path.write_text("".join(lines))
    return len(lines)


def check_output(output: str | None, as_json: bool, export_format: str,
                 detach: bool = False) -> None:
    """``-o``/``--json``/``--format`` combinations that cannot work: one ConfigError line."""
    from ..sdk.export_formats import check_format

    if output == "-" and as_json:
        raise ConfigError("-o - and --json both write to stdout: pick one")
    if output is not None and detach:
        raise ConfigError(
            "-o needs an attached run; with --detach, export later: rollouts export JOB -o FILE"
        )
    if output is not None and output != "-" and not Path(output).parent.exists():
        raise ConfigError(f"-o {output}: folder {Path(output).parent} does not exist")
    check_format(export_format)
