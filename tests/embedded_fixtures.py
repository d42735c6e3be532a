"""The embedded Temporal dev server as a session fixture, for tests that run ``rollouts`` commands.

The session's ``$ROLLOUTS_HOME`` (a temp dir, see tests/conftest.py) gets the embedded dev server
started by ``ensure_dev_server`` (Web UI on): exactly the server that ``rollouts`` commands without
``--temporal`` reuse. It is stopped at the end of the session. A directory's conftest imports the
fixtures (``from embedded_fixtures import embedded_server, stop_embedded_server_at_exit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from durable_rollouts.temporal.connection import DevServer, _free_port, ensure_dev_server, stop_dev_server

__all__ = ["embedded_server", "stop_embedded_server_at_exit"]


@pytest.fixture(scope="session", autouse=True)
def stop_embedded_server_at_exit() -> Iterator[None]:
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
