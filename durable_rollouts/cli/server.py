"""``rollouts server``: the embedded Temporal dev server in the foreground.

The body is ``cli.service.run_server`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import drive

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)


@app.command(
    epilog="""Examples:

  rollouts server                 # then open the printed Web UI address

  rollouts server --port 7233 --ui-port 8233
"""
)
def server(
    port: Annotated[
        int | None, typer.Option("--port", help="gRPC port (default 7233, else a free one)")
    ] = None,
    ui_port: Annotated[
        int | None,
        typer.Option("--ui-port", help="Web UI port (default 8233, else a free one)"),
    ] = None,
    headless: Annotated[bool, typer.Option("--headless", help="no Web UI")] = False,
) -> None:
    """Run the embedded Temporal dev server (sqlite in $ROLLOUTS_HOME, Web UI) in the foreground.

    Other commands without --temporal use it. If it is already running, prints its addresses.
    """
    from durable_rollouts.cli.service import run_server

    drive(lambda out, err: run_server(out, port=port, ui_port=ui_port, headless=headless))
