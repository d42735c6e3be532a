"""The ``rollouts`` command (typer): the entry point. One module per command group:

``run`` (run, resume), ``stream`` (a streamed job's finished groups), ``regrade``, ``worker``,
``server``, ``inspect`` (jobs, show, cancel, export, trace), ``gc``, ``task`` (``serve ENV.py`` and
``task list|start|grade``, for checking an environment by hand). Those modules only parse
arguments; the bodies live in ``batch``, ``consume``, ``regrade_run``, ``views`` and ``service``
(over ``durable_rollouts.temporal``'s job API), formatting in ``render`` and ``progress``, option
parsing in ``specs``, the shared error edge in ``common``. Every body runs under
:func:`cli_errors` (or ``common.drive``), so bad input ends as one ``error:`` line on stderr with
exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
import warnings

import typer
from typer.exceptions import TyperException

from durable_rollouts.cli import gc, inspect, regrade, run, server, stream, task, worker
from durable_rollouts.cli.common import cli_errors, fail
from durable_rollouts.cli.storage_option import add_storage_option
from durable_rollouts.cli.task import URL_ENV_VAR, task_app

__all__ = ["URL_ENV_VAR", "app", "cli_errors", "fail", "main", "task_app"]

app = typer.Typer(
    name="rollouts",
    help="Durable agent rollouts against RL environments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for _group in (run, stream, regrade, worker, server, inspect, gc, task):
    app.add_typer(_group.app)  # no name: the group's commands join ``rollouts`` directly


# -- entry point ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: usage errors become one ``error:`` line with exit code 2."""
    # asyncssh imports cryptography's DSA classes, and cryptography 51 warns on that import in
    # every process: noise a user cannot act on, which would turn a one-line error into eleven.
    warnings.filterwarnings("ignore", message=r"DSA is deprecated", module=r"asyncssh(\.|$)")
    try:
        command = typer.main.get_command(app)
        add_storage_option(command)  # --storage next to every --temporal
        code = command.main(args=argv, prog_name="rollouts", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted (a job already started keeps its state in Temporal: `rollouts jobs`; "
                   "finish it with `rollouts worker` or stop it with `rollouts cancel JOB`)", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except TyperException as exc:  # usage errors: missing/bad option, unknown command
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message.strip():  # empty when the help text was already shown (no arguments)
            typer.echo(f"error: {message}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
