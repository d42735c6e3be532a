"""``rollouts worker``: run a worker (workflows and rollout steps) until Ctrl-C / SIGTERM.

The body is ``cli.service.run_worker`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import ConnectTimeoutOption, TemporalOption, drive

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)


@app.command(
    "worker",
    epilog="""Examples:

  rollouts worker                                   # against the embedded dev server

  rollouts worker --temporal temporal.internal:7233 --host-queue auto

  rollouts worker --gc-every 60                     # sweep leaked sandboxes every minute

  rollouts worker --max-concurrent 2000             # hold 2,000 waiting agents at once
""",
)
def worker_command(
    temporal: TemporalOption = None,
    task_queue: Annotated[
        str | None,
        typer.Option(
            "--task-queue", help="the shared task queue (default $ROLLOUTS_TASK_QUEUE, else "
            "'rollouts')"
        ),
    ] = None,
    host_queue: Annotated[
        str | None,
        typer.Option(
            "--host-queue", help="'auto' = <queue>@<hostname> for host-local substrates"
        ),
    ] = None,
    until_job: Annotated[
        str | None, typer.Option("--until-job", help="exit once this job has closed")
    ] = None,
    gc_every: Annotated[
        float | None,
        typer.Option(
            "--gc-every",
            min=0.0,
            metavar="SECONDS",
            help="remove orphaned substrates (what `rollouts gc` finds) every SECONDS; "
            "0 disables it (default $ROLLOUTS_GC_EVERY, else 300)",
        ),
    ] = None,
    max_concurrent: Annotated[
        int | None,
        typer.Option(
            "--max-concurrent",
            min=1,
            metavar="N",
            help="rollouts this worker holds in flight at once: sizes its activity slots and "
            "workflow cache (default 500; warns when the file-descriptor limit or memory "
            "cannot hold N)",
        ),
    ] = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """Run a worker (workflows and rollout steps) until Ctrl-C / SIGTERM.

    In the background it removes orphaned substrates (leaked containers and env
    subprocesses whose rollout is over) every --gc-every seconds, first soon after start.
    """
    from durable_rollouts.cli.service import run_worker

    drive(
        lambda out, err: run_worker(
            temporal,
            task_queue=task_queue,
            host_queue=host_queue,
            until_job=until_job,
            connect_timeout=connect_timeout,
            gc_every_s=gc_every,
            max_concurrent=max_concurrent,
            out=out,
        )
    )
