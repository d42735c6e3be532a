"""Fixtures of the HUD v6 compatibility tests: the fixture files, hud's own server in a child
process, the Temporal dev servers.

Every test module that needs the real ``hud`` package starts with ``pytest.importorskip("hud")``,
so without it they are skipped with that reason (``pip install 'durable-rollouts[hud]'``).
``hud_served(path)`` serves an env file the way ``hud serve`` does, with hud's own entry
``python -m hud.environment.server`` (hud's typer CLI does not run next to our typer).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedded_fixtures import embedded_server, stop_embedded_server_at_exit  # noqa: F401
from hud_paths import FIXTURES, HERE, MCP_ENV, QUICKSTART, announced  # noqa: F401
from temporal_fixtures import client, dev_server, task_queue  # noqa: F401

HUD_PORT_LINE = "HUD_SERVE_PORT="


@pytest.fixture
def hud_served() -> Iterator[object]:
    """``with hud_served(path) as url``: the env file served by hud's own server, in a child."""

    def serve(path: Path) -> Any:
        return announced([sys.executable, "-m", "hud.environment.server", str(path)], HUD_PORT_LINE, path.parent)

    yield serve
