"""Fixtures of the CLI tests: one embedded Temporal dev server per session.

The session's ``$ROLLOUTS_HOME`` (a temp dir, see tests/conftest.py) gets the embedded dev server
started by ``temporal.connection.ensure_dev_server`` (Web UI on): exactly the server that ``rollouts``
commands without ``--temporal`` reuse. It is stopped at the end of the session.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator

import pytest
from cli_helpers import alive, wait_until

from durable_rollouts.temporal.connection import DevServer, ensure_dev_server, stop_dev_server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session", autouse=True)
def _stop_embedded_server_at_exit() -> Iterator[None]:
    """Whatever started the embedded server in this session's home (a test or a CLI), stop it."""
    yield
    stop_dev_server()


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[DevServer]:
    """The embedded dev server in this session's ROLLOUTS_HOME (what the CLI uses by default)."""
    # Free ports, not the default 7233/8233: a concurrent test session (another ROLLOUTS_HOME) may
    # be starting its own server on 7233 at the same moment, and the two would share it.
    server = asyncio.run(ensure_dev_server(port=_free_port(), ui_port=_free_port()))
    yield server
    stop_dev_server()


@pytest.fixture
def background_workers() -> Iterator[list[int]]:
    """Pids of the workers `run --detach` started; any still alive at the end get SIGTERM."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda pid=pid: not alive(pid), timeout=15, what=f"worker {pid} to stop")
