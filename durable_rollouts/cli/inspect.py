"""``rollouts jobs``, ``show``, ``cancel``, ``export`` and ``trace``: look at and stop jobs.

Thin typer functions; the bodies live in ``cli.views`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import ConnectTimeoutOption, JsonOption, TemporalOption, drive

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)


@app.command(
    epilog="""Examples:

  rollouts jobs

  rollouts jobs --status running --limit 5 --json
"""
)
def jobs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status", help="running, completed, cancelled, failed, terminated, timed_out"
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="how many jobs")] = 20,
    temporal: TemporalOption = None,
    as_json: JsonOption = False,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """List recent jobs, newest first (from Temporal visibility)."""
    from durable_rollouts.cli.views import jobs as list_jobs

    drive(
        lambda out, err: list_jobs(
            out,
            status=status,
            limit=limit,
            temporal=temporal,
            as_json=as_json,
            connect_timeout=connect_timeout,
        )
    )


@app.command(
    epilog="""Examples:

  rollouts show 3f2a9c...

  rollouts show 3f2a9c... --json | jq '.rollouts[] | select(.status != "succeeded")'
"""
)
def show(
    job: Annotated[str, typer.Argument(help="job id")],
    temporal: TemporalOption = None,
    as_json: JsonOption = False,
    connect_timeout: ConnectTimeoutOption = 5.0,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="every rollout even on a job of more than 2,000 (reads every result: slow)",
        ),
    ] = False,
) -> None:
    """Show a job: per-task summary, every rollout's status/reward/attempts/error, zero-spread groups.

    A job of more than 2,000 rollouts shows its counters and latest rollouts instead (fast at any
    length); --all or --json read every rollout."""
    from durable_rollouts.cli.views import show as show_job

    drive(
        lambda out, err: show_job(
            out, job, temporal=temporal, as_json=as_json, connect_timeout=connect_timeout,
            every=every,
        )
    )


@app.command(
    epilog="""Example:

  rollouts cancel 3f2a9c...
"""
)
def cancel(
    job: Annotated[str, typer.Argument(help="job id")],
    temporal: TemporalOption = None,
    wait: Annotated[
        float, typer.Option("--wait", help="seconds to wait for teardowns to finish")
    ] = 60.0,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """Cancel a running job; every started rollout still tears its substrate down."""
    from durable_rollouts.cli.views import cancel as cancel_job

    drive(
        lambda out, err: cancel_job(
            out, job, temporal=temporal, wait_s=wait, connect_timeout=connect_timeout
        )
    )


@app.command(
    epilog="""Examples:

  rollouts export 3f2a9c... -o runs.jsonl

  rollouts export 3f2a9c... -o - | head -1 | jq .reward

  rollouts export 3f2a9c... -o sft.jsonl --format openai

  rollouts export 3f2a9c... -o trajectories.jsonl --format atif

  rollouts export 3f2a9c... -o trajectories-v1.4.jsonl --format atif-1.4
"""
)
def export(
    job: Annotated[str, typer.Argument(help="job id")],
    output: Annotated[
        str, typer.Option("-o", "--output", help="JSONL file to write ('-' = stdout)")
    ],
    export_format: Annotated[
        str,
        typer.Option(
            "--format", help="jsonl (default), openai, atif (ATIF-v1.8), atif-1.8 or atif-1.4"
        ),
    ] = "jsonl",
    temporal: TemporalOption = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """Write a job's runs, one line per rollout (latest result of each rollout id).

    jsonl fields: job_id, rollout_id, slug, group_id, group_index, status, reward, dropped,
    task_id, env, args, grade, attempts, retries, retry_history, error, error_phase, prompt,
    answer, trace, policy_version. openai: chat fine-tuning lines (messages, tools) plus reward,
    group_id, status, policy_version. atif: one ATIF-v1.8 trajectory per line (atif-1.4: ATIF-v1.4).
    reward is null unless the rollout succeeded (its best-effort grade stays under grade).
    """
    from durable_rollouts.cli.views import export as export_job

    drive(
        lambda out, err: export_job(
            err if output == "-" else out,
            job,
            output,
            temporal=temporal,
            connect_timeout=connect_timeout,
            export_format=export_format,
        )
    )


@app.command(
    epilog="""Examples:

  rollouts trace 3f2a9c... 0                       # the first rollout in `rollouts show`

  rollouts trace 3f2a9c... count_letter-352c4b24-1  # by (the end of) its rollout id
"""
)
def trace(
    job: Annotated[str, typer.Argument(help="job id")],
    rollout: Annotated[
        str, typer.Argument(help="rollout id, its end, or its row number in `show`")
    ],
    temporal: TemporalOption = None,
    as_json: JsonOption = False,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """Print one rollout's trace: prompt, every step, the answer and the grade."""
    from durable_rollouts.cli.views import trace as trace_run

    drive(
        lambda out, err: trace_run(
            out,
            job,
            rollout,
            temporal=temporal,
            as_json=as_json,
            connect_timeout=connect_timeout,
        )
    )
