"""``rollouts regrade``: re-grade a job's saved rollouts into a new job, calling no agent.

A thin typer function; the body lives in ``cli.regrade_run`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import (
    ConnectTimeoutOption,
    JsonOption,
    TemporalOption,
    WorkerOption,
    drive,
)

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)

_HELP = """Re-grade the saved rollouts of JOB (a job id, or a file written by `rollouts export --format jsonl`) into a new job, without calling any agent.

Every rollout with a final answer runs again with all its steps (provision, connect, start, agent, grade, a verifier's verify, teardown), but its agent step only re-plays the saved trajectory: the environment grades the saved answer anew in a fresh session. Rollouts without an answer are skipped and listed. Prints the new job id and how many rewards changed. Exit code: 0 every re-graded rollout succeeded, 1 some did not, 2 bad input.

--grader ENV.py grades with the task templates of that env file instead of the environment the rollouts ran in (same task ids and args: e.g. a fixed reward function), served by a local runtime (or subprocess, when the job ran on one or --runtime says so).

--runtime: as for `rollouts run`; default: the job's own runtime (local for an export file).
"""

_EPILOG = """Examples:

  rollouts regrade 3f2a9c...

  rollouts regrade 3f2a9c... --grader env_v2.py --json

  rollouts regrade runs.jsonl --runtime subprocess:env.py -o regraded.jsonl
"""


@app.command(help=_HELP, epilog=_EPILOG)
def regrade(
    job: Annotated[str, typer.Argument(help="job id, or a .jsonl file from `rollouts export`")],
    grader: Annotated[
        str | None, typer.Option("--grader", help="grade with this env file's templates (ENV.py)")
    ] = None,
    runtime: Annotated[
        str | None,
        typer.Option("--runtime", help="local, subprocess, docker:IMAGE, ... (default: the job's)"),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="the new job's name (default: <job name>-regrade)")
    ] = None,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", help="rollouts in flight at once")
    ] = 16,
    temporal: TemporalOption = None,
    worker: WorkerOption = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
    as_json: JsonOption = False,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="write the new job's runs here ('-' = stdout)"),
    ] = None,
    export_format: Annotated[
        str, typer.Option("--format", help="-o format: jsonl, openai, atif, atif-1.8 or atif-1.4")
    ] = "jsonl",
) -> None:
    from durable_rollouts.cli.regrade_run import RegradeOptions, regrade_job

    opts = RegradeOptions(
        source=job, grader=grader, runtime=runtime, name=name, max_concurrent=max_concurrent,
        temporal=temporal, worker=worker, connect_timeout=connect_timeout, as_json=as_json,
        output=output, export_format=export_format,
    )
    drive(lambda out, err: regrade_job(opts, out, err))
