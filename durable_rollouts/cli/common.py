"""Shared pieces of the ``rollouts`` command modules: one-line errors, consoles, common options.

``cli_errors()`` turns package errors into one ``error:`` line on stderr (exit 2 for user
mistakes, 1 for failures); ``drive()`` runs a command's coroutine under it and also maps Temporal
errors (``temporal.errors``) and anything unexpected, so no command ends in a traceback. Imports
typer and errors only (``durable_rollouts.temporal`` and rich lazily).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Annotated, Any, NoReturn

import typer

from durable_rollouts.errors import (
    ConfigError,
    DurableRolloutsError,
    ProtocolError,
    ReadyTimeoutError,
)
from durable_rollouts.protocol import ErrorCode

__all__ = [
    "ConnectTimeoutOption",
    "JsonOption",
    "TemporalOption",
    "cli_errors",
    "consoles",
    "drive",
    "fail",
    "json_option",
]

# Protocol errors that mean "the user asked for something wrong" rather than "it broke".
_USER_ERROR_CODES = {ErrorCode.INVALID_PARAMS, ErrorCode.INVALID_REQUEST, ErrorCode.UNAUTHORIZED}


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one ``error:`` line on stderr and exit with ``code``."""
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn package errors into one stderr line: user mistakes exit 2, failures exit 1."""
    try:
        yield
    except ConfigError as exc:
        fail(str(exc), 2)
    except ProtocolError as exc:
        fail(exc.message, 2 if exc.code in _USER_ERROR_CODES else 1)
    except ReadyTimeoutError as exc:
        fail(f"no env server answered: {exc}", 1)
    except DurableRolloutsError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}", 1)


def consoles() -> tuple[Any, Any]:
    """(stdout, stderr) rich consoles; markup off, so ids and error texts print verbatim."""
    import os
    import sys

    from rich.console import Console

    def width(stream: Any) -> int | None:  # piped output: wide tables rather than wrapped cells
        return None if stream.isatty() or "COLUMNS" in os.environ else 140

    return (
        Console(markup=False, highlight=False, width=width(sys.stdout)),
        Console(stderr=True, markup=False, highlight=False, width=width(sys.stderr)),
    )


def drive(make: Callable[[Any, Any], Coroutine[Any, Any, int]]) -> NoReturn:
    """Run ``make(out, err)`` and exit with the code it returns; every error is one line.

    The process ends with ``os._exit`` once the output is flushed: temporalio's native client can
    abort the interpreter during finalization (``PyGILState_Release`` from its runtime thread,
    seen after a refused connection), and a finished command has nothing left to clean up.
    Set ``ROLLOUTS_CLI_SOFT_EXIT=1`` to raise ``typer.Exit`` instead (calling ``main()`` in-process).
    """
    import os
    import sys

    from durable_rollouts.temporal.errors import TEMPORAL_ERRORS, temporal_error_line

    out, err = consoles()
    code = 1
    try:
        with cli_errors():
            try:
                code = _run(make(out, err))
            except TEMPORAL_ERRORS as exc:
                fail(temporal_error_line(exc), 1)
            except (typer.Exit, DurableRolloutsError, OSError):
                raise
            except Exception as exc:  # noqa: BLE001 - never a traceback
                fail(f"{type(exc).__name__}: {exc}", 1)
    except typer.Exit as exc:
        code = exc.exit_code
    if _soft_exit():
        raise typer.Exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _soft_exit() -> bool:
    """``ROLLOUTS_CLI_SOFT_EXIT``; a malformed environment has been reported already."""
    from durable_rollouts.settings import settings

    try:
        return settings().cli_soft_exit
    except ConfigError:
        return False


CLEANUP_S = 15.0


def _run(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run`` whose clean-up is bounded: a background task (an in-process worker, an
    env server) that does not stop within ``CLEANUP_S`` after the command finished must not keep
    the process alive; the process then exits at once with the command's code."""
    import os
    import sys

    loop = asyncio.new_event_loop()
    try:
        code = loop.run_until_complete(main)
    except BaseException:
        _cancel_rest(loop)
        loop.close()
        raise
    if not _cancel_rest(loop):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    loop.close()
    return code


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> bool:
    """Cancel the loop's remaining tasks and wait up to ``CLEANUP_S``; True if all finished."""
    rest = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in rest:
        task.cancel()
    if rest:
        _, pending = loop.run_until_complete(asyncio.wait(rest, timeout=CLEANUP_S))
        if pending:
            return False
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), CLEANUP_S))
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), CLEANUP_S))
    except TimeoutError:
        return False
    return True


def json_option(raw: str | None, option: str) -> dict[str, Any]:
    """A JSON-object option (``{}`` when absent); malformed JSON exits 2 with one line."""
    from durable_rollouts.cli.specs import parse_json_object

    with cli_errors():
        return parse_json_object(raw, option)
    raise AssertionError("unreachable")  # pragma: no cover


TemporalOption = Annotated[
    str | None,
    typer.Option(
        "--temporal",
        help="Temporal HOST:PORT (default: $ROLLOUTS_TEMPORAL_ADDRESS, "
        "else the embedded dev server)",
    ),
]
ConnectTimeoutOption = Annotated[
    float, typer.Option("--connect-timeout", help="seconds to wait for Temporal")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
WorkerOption = Annotated[
    bool | None,
    typer.Option(
        "--worker/--no-worker",
        help="run a worker in this process (default: only with the embedded server)",
    ),
]
