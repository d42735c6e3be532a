"""Fixtures of the CLI tests: one embedded Temporal dev server per session (``embedded_fixtures``)."""

from __future__ import annotations

from embedded_fixtures import embedded_server, stop_embedded_server_at_exit  # noqa: F401
