"""Fixtures of the upgrade tests: one real Temporal dev server per session, a client per test.

The helpers of ``tests/temporal`` (``DevServer``, ``WorkerProcess``, the counting env) are
imported from there, as worker subprocesses do.
"""

from __future__ import annotations

from temporal_fixtures import client, dev_server  # noqa: E402,F401  (shared fixtures)
