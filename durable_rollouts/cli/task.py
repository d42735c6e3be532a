"""``rollouts serve ENV.py`` and ``rollouts task list|start|grade``: check an environment by hand.

``serve`` runs ``envserver.entry.run_serve``; the ``task`` commands talk to a running env server
over the control channel (``client``), both imported lazily.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from durable_rollouts.cli.common import cli_errors, fail
from durable_rollouts.errors import ConfigError
from durable_rollouts.settings import settings, var

__all__ = ["URL_ENV_VAR", "app", "task_app"]

URL_ENV_VAR = var("url")

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)
task_app = typer.Typer(
    help="Start and grade single tasks by hand against a running env server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(task_app, name="task")


def _server_url(url: str | None, source: str | None = None) -> str:
    if not url:
        with cli_errors():
            url = settings().url
    resolved = url
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
    from durable_rollouts.envserver.entry import run_serve

    limits = {"max_connections": max_connections, "max_tasks": max_tasks}
    given = {name: value for name, value in limits.items() if value is not None}
    raise typer.Exit(run_serve(target, env_name=env, host=host, port=port, **given))


# -- task list | start | grade --------------------------------------------------------------------


async def _list(url: str, timeout: float) -> list[dict[str, Any]]:
    from durable_rollouts.client.envclient import connect

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
    from durable_rollouts.client.envclient import connect

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
    from durable_rollouts.client.envclient import connect

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
