"""Fixtures of the HUD v6 compatibility tests: the fixture files, hud's own server in a child
process, the Temporal dev servers.

Every test module that needs the real ``hud`` package starts with ``pytest.importorskip("hud")``,
so without it they are skipped with that reason (``pip install 'durable-rollouts[hud]'``).
``hud_served(path)`` serves an env file the way ``hud serve`` does, with hud's own entry
``python -m hud.environment.server`` (hud's typer CLI does not run next to our typer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
QUICKSTART = FIXTURES / "quickstart" / "tasks.py"
MCP_ENV = FIXTURES / "mcp_tools" / "env.py"

from embedded_fixtures import embedded_server, stop_embedded_server_at_exit  # noqa: F401
from temporal_fixtures import client, dev_server, task_queue  # noqa: F401

HUD_PORT_LINE = "HUD_SERVE_PORT="


@contextmanager
def announced(cmd: list[str], port_line: str, cwd: Path | None = None) -> Iterator[str]:
    """Run ``cmd`` (a server printing ``<port_line><port>``) until the block ends; yields its url."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(cwd) if cwd else None, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(port_line):
                break
        else:
            raise AssertionError(f"{' '.join(cmd)} never announced its port:\n{''.join(seen)}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never blocks on a full pipe
        yield f"tcp://127.0.0.1:{int(line[len(port_line):])}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def hud_served() -> Iterator[object]:
    """``with hud_served(path) as url``: the env file served by hud's own server, in a child."""

    def serve(path: Path) -> Any:
        return announced([sys.executable, "-m", "hud.environment.server", str(path)], HUD_PORT_LINE, path.parent)

    yield serve
