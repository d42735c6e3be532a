"""Bad input to `rollouts` ends as ONE `error:` line on stderr with exit code 2, never a traceback."""

from __future__ import annotations

import socket
import time

import pytest
from cli_helpers import LETTERS, assert_one_line_error, rollouts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "no/such/tasks.py", "--agent", "fixed"], "tasks file not found: no/such/tasks.py"),
        (["run", str(LETTERS), "--agent", "nosuchagent"], "unknown agent 'nosuchagent'"),
        (
            ["run", str(LETTERS), "--agent", "no_such_module:Agent"],
            "cannot import agent module 'no_such_module'",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--agent-config", "{oops"],
            "--agent-config is not valid JSON",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--agent-config", "[1]"],
            "--agent-config must be a JSON object",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--agent-config", '{"nope": 1}'],
            "invalid config for agent 'fixed'",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--runtime", "warp:9"],
            "unknown runtime 'warp:9'",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--runtime", "local:missing_env.py"],
            "env file not found",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--runtime", "tcp://nohost"],
            "expected tcp://HOST:PORT",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--group", "0"],
            "group must be a positive integer",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--max-substrates", "0"],
            "max_substrates=0: use a whole number of at least 1",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--max-provisions-per-s", "-1"],
            "max_provisions_per_s=-1.0: use a number above 0",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--runtime", "tcp://127.0.0.1:9",
             "--max-substrates", "2"],
            "need a runtime that places substrates",
        ),
        (
            ["run", str(LETTERS), "--agent", "fixed", "--temporal", "not an address"],
            "is not HOST:PORT",
        ),
        (["run", str(LETTERS)], "Missing option '--agent'"),
        (["run", str(LETTERS), "--agent", "fixed", "--epochs", "-1"], "epochs=-1: use a whole number"),
        (["run", str(LETTERS), "--agent", "fixed", "--epochs", "0"], "epochs=0: use a whole number"),
        (["resume", "somejob", "--only", "bogus"], "--only 'bogus'"),
        (["jobs", "--limit", "0"], "--limit must be at least 1"),
        (["worker", "--max-concurrent", "0"], "--max-concurrent"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str) -> None:
    """Missing files, unknown agents/runtimes, malformed JSON and bad options: one line, exit 2."""
    assert_one_line_error(rollouts(*args), needle)


def test_unreachable_temporal_names_the_address_and_fails_fast() -> None:
    """Nothing listens at --temporal: exit 2 within the short connect timeout, naming the address."""
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = rollouts("jobs", "--temporal", address, "--connect-timeout", "2")
    assert_one_line_error(result, f"Temporal at {address}")
    assert time.monotonic() - started < 15


def test_run_against_unreachable_temporal_from_the_environment_is_a_user_error() -> None:
    """$ROLLOUTS_TEMPORAL_ADDRESS is honoured, and an unreachable one is reported with its address."""
    address = f"127.0.0.1:{free_port()}"
    result = rollouts(
        "run",
        str(LETTERS),
        "--agent",
        "fixed",
        "--connect-timeout",
        "2",
        ROLLOUTS_TEMPORAL_ADDRESS=address,
    )
    assert_one_line_error(result, address)


@pytest.mark.parametrize(
    "command",
    ["run", "resume", "regrade", "jobs", "show", "cancel", "export", "trace", "gc", "worker",
     "server"],
)
def test_every_command_has_help_with_examples(command: str) -> None:
    from typer.testing import CliRunner

    from durable_rollouts.cli import app

    result = CliRunner().invoke(
        app, [command, "--help"], prog_name="rollouts", env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "Example" in result.output and f"rollouts {command}" in result.output
