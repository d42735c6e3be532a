"""The ``rollouts`` command (typer): the entry point. Modules here only parse arguments.

Commands: ``run``, ``resume``, ``worker``, ``server`` (``cli_batch``); ``jobs``, ``show``,
``cancel``, ``export``, ``trace``, ``gc`` (``cli_inspect``); ``serve ENV.py`` and ``task
list|start|grade`` (here) for checking an environment by hand. Their logic lives in
``durable_rollouts.commands``. Every body runs under :func:`cli_errors` (or ``cli_common.drive``),
so bad input ends as one ``error:`` line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Annotated, Any

import typer
from typer.exceptions import TyperException

from . import cli_batch, cli_inspect
from .cli_common import cli_errors, fail
from .errors import ConfigError

__all__ = ["URL_ENV_VAR", "app", "cli_errors", "fail", "main", "task_app"]

URL_ENV_VAR = "ROLLOUTS_URL"

app = typer.Typer(
    name="rollouts",
    help="Durable agent rollouts against RL environments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
task_app = typer.Typer(
    help="Start and grade single tasks by hand against a running env server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
cli_batch.register(app)
cli_inspect.register(app)
app.add_typer(task_app, name="task")


def _server_url(url: str | None, source: str | None = None) -> str:
    resolved = url or os.environ.get(URL_ENV_VAR)
    if not resolved:
        hint = f"start one with `rollouts serve {source}` and " if source else ""
        fail(f"no env server given: {hint}pass --url tcp://HOST:PORT or set {URL_ENV_VAR}")
    if not resolved.startswith("tcp://"):
        fail(f"expected a tcp://HOST:PORT url, got {resolved!r}")
    return resolved


def _parse_args_json(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        fail(f"--args is not valid JSON: {exc}")
    if not isinstance(value, dict):
        fail(f"--args must be a JSON object, got {type(value).__name__}")
    return value


UrlOption = Annotated[
    str | None, typer.Option("--url", help=f"control channel url (default: ${URL_ENV_VAR})")
]
TimeoutOption = Annotated[float, typer.Option("--ready-timeout", help="seconds to wait for the server")]


# -- serve ----------------------------------------------------------------------------------------


@app.command()
def serve(
    target: Annotated[str, typer.Argument(help="env.py path, module or module:attr")],
    env: Annotated[str | None, typer.Option("--env", help="environment name when the file has several")] = None,
    host: Annotated[str, typer.Option(help="address to bind (non-loopback needs ROLLOUTS_ENV_TOKEN)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind (0 = any free port)")] = 0,
    max_connections: Annotated[
        int | None, typer.Option(help="connections served at once; more are refused as busy (default 4096)")
    ] = None,
    max_tasks: Annotated[
        int | None, typer.Option(help="tasks in progress at once, parked ones included (default 2048)")
    ] = None,
) -> None:
    """Serve an environment on one TCP port until Ctrl-C / SIGTERM."""
    from .envserver.entry import run_serve

    limits = {"max_connections": max_connections, "max_tasks": max_tasks}
    given = {name: value for name, value in limits.items() if value is not None}
    raise typer.Exit(run_serve(target, env_name=env, host=host, port=port, **given))


# -- task list | start | grade --------------------------------------------------------------------


async def _list(url: str, timeout: float) -> list[dict[str, Any]]:
    from .sdk.client import connect

    async with await connect(url, ready_timeout=timeout, keepalive_s=None) as client:
        return await client.list_tasks()


@task_app.command("list")
def task_list(
    url: UrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full tasks.list entries")] = False,
    ready_timeout: TimeoutOption = 5.0,
) -> None:
    """List the tasks a running env server offers."""
    with cli_errors():
        tasks = asyncio.run(_list(_server_url(url), ready_timeout))
    if as_json:
        typer.echo(json.dumps(tasks, indent=2))
        return
    for entry in tasks:
        names = ", ".join(entry.get("args", {}).get("properties", {}))
        typer.echo(f"{entry['id']}({names})  {entry.get('description', '')}".rstrip())


async def _start(url: str, task: str, args: dict[str, Any], timeout: float) -> tuple[str | None, dict[str, Any]]:
    from .sdk.client import connect

    client = await connect(url, ready_timeout=timeout, keepalive_s=None)
    try:
        prompt = await client.start_task(task, args)
        return client.session_id, prompt
    finally:
        await client.close()  # no bye: the task stays parked for `task grade`


@task_app.command("start")
def task_start(
    task: Annotated[str, typer.Argument(help="task template id")],
    args: Annotated[str, typer.Option("--args", help="task arguments as a JSON object")] = "{}",
    url: UrlOption = None,
    source: Annotated[str | None, typer.Option("--source", help="the env.py the server runs (for hints)")] = None,
    ready_timeout: TimeoutOption = 5.0,
) -> None:
    """Start TASK and print its prompt; the task stays parked on the server for `task grade`."""
    parsed = _parse_args_json(args)
    server = _server_url(url, source)
    with cli_errors():
        session_id, prompt = asyncio.run(_start(server, task, parsed, ready_timeout))
    text = prompt.get("prompt")
    typer.echo(text if isinstance(text, str) and len(prompt) == 1 else json.dumps(prompt, indent=2))
    typer.echo(f"session {session_id} parked; grade it with: rollouts task grade {task} --answer ...", err=True)


async def _grade(url: str, task: str, answer: str, session: str | None, timeout: float) -> dict[str, Any]:
    from .sdk.client import connect

    client = await connect(url, ready_timeout=timeout, session_id=session, keepalive_s=None)
    try:
        known = {entry["id"] for entry in await client.list_tasks()}
        if task not in known:
            raise ConfigError(f"unknown task {task!r} (known: {', '.join(sorted(known))})")
        result = await client.grade(answer)
        await client.bye()  # graded: this session is done
        return result
    finally:
        await client.close()


@task_app.command("grade")
def task_grade(
    task: Annotated[str, typer.Argument(help="task template id (as given to `task start`)")],
    answer: Annotated[str, typer.Option("--answer", help="the answer to grade")],
    url: UrlOption = None,
    session: Annotated[str | None, typer.Option("--session", help="resume this parked session")] = None,
    ready_timeout: TimeoutOption = 5.0,
) -> None:
    """Grade the parked task (the lone one, or --session's) with ANSWER and print the score."""
    server = _server_url(url)
    with cli_errors():
        result = asyncio.run(_grade(server, task, answer, session, ready_timeout))
    typer.echo(json.dumps(result))


# -- entry point ----------------------------------------------------------------------------------


def _use_storage(ctx: Any, param: Any, value: str | None) -> None:
    if value:
        from .temporal.storage import STORAGE_ENV, parse_storage_url

        try:
            parse_storage_url(value)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
        os.environ[STORAGE_ENV] = value  # the data converter of this process (and its children)


def add_storage_option(group: Any) -> None:
    """Give every command that connects to Temporal (it has ``--temporal``) a ``--storage URL``."""
    from typer.core import TyperOption

    for command in getattr(group, "commands", {}).values():
        add_storage_option(command)
        params = {p.name: p for p in command.params}
        if "temporal" in params and "storage" not in params:
            command.params.append(TyperOption(  # an optional string, like --temporal
                param_decls=["--storage"], type_descriptor=params["temporal"].type_descriptor,
                expose_value=False, callback=_use_storage, is_eager=True,
                help="where state outside Temporal lives: file://PATH, s3://BUCKET/PREFIX or "
                     "gs://BUCKET/PREFIX (default: $ROLLOUTS_STORAGE, else "
                     "file://$ROLLOUTS_HOME/storage)"))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: usage errors become one ``error:`` line with exit code 2."""
    try:
        command = typer.main.get_command(app)
        add_storage_option(command)
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
