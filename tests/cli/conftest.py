"""Fixtures of the CLI tests: one embedded Temporal dev server per session (``embedded_fixtures``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli_helpers, flaky_agent

from embedded_fixtures import embedded_server, stop_embedded_server_at_exit  # noqa: E402,F401
