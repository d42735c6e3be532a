"""Fixtures of the CLI tests: one embedded Temporal dev server per session (``embedded_fixtures``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from cli_helpers import alive, wait_until
from embedded_fixtures import embedded_server, stop_embedded_server_at_exit  # noqa: F401


@pytest.fixture
def background_workers() -> Iterator[list[int]]:
    """Pids of the workers `run --detach` started; any still alive at the end get SIGTERM."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda pid=pid: not alive(pid), timeout=15, what=f"worker {pid} to stop")
