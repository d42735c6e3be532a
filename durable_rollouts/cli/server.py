"""``rollouts server`` (the embedded Temporal dev server in the foreground), ``server status|stop``.

The bodies are in ``cli.service`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import JsonOption, drive

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)

server_app = typer.Typer(
    invoke_without_command=True,
    no_args_is_help=False,
    help="Run the embedded Temporal dev server in the foreground; `status` / `stop` for the "
    "one `rollouts run` leaves running.",
    epilog="""Examples:

  rollouts server                 # then open the printed Web UI address

  rollouts server --port 7233 --ui-port 8233

  rollouts server status          # exit 1 when none is running

  rollouts server stop
""",
)
app.add_typer(server_app, name="server")


@server_app.callback()
def server(
    ctx: typer.Context,
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
    if ctx.invoked_subcommand is not None:
        return
    from durable_rollouts.cli.service import run_server

    drive(lambda out, err: run_server(out, port=port, ui_port=ui_port, headless=headless))


@server_app.command("status")
def server_status(as_json: JsonOption = False) -> None:
    """Show the embedded server: addresses, pid, database file, Web UI link; exit 1 if none runs."""
    from durable_rollouts.cli.service import server_status as status

    drive(lambda out, err: status(out, as_json=as_json))


@server_app.command("stop")
def server_stop() -> None:
    """Stop the embedded server `rollouts run` left running (exit 0 also when none was)."""
    from durable_rollouts.cli.service import server_stop as stop

    drive(lambda out, err: stop(out))
