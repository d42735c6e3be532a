"""``rollouts gc``: remove substrates whose rollout is over (``durable_rollouts.gc``).

The body is ``cli.service.collect_garbage`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import ConnectTimeoutOption, TemporalOption, drive

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)


@app.command(
    epilog="""Examples:

  rollouts gc --dry-run

  rollouts gc --job 3f2a9c...
"""
)
def gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only list what would be removed")
    ] = False,
    job: Annotated[
        str | None, typer.Option("--job", help="only substrates of this job")
    ] = None,
    temporal: TemporalOption = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    """Remove substrates (containers, env processes) whose rollout is over."""
    from durable_rollouts.cli.service import collect_garbage

    drive(
        lambda out, err: collect_garbage(
            out, dry_run=dry_run, job=job, temporal=temporal, connect_timeout=connect_timeout
        )
    )
