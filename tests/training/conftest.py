"""Fixtures of the training-results tests: one real dev server per session (search attributes
registered, as the embedded server does), a client and a task queue per test, and helpers to
run the real ``rollouts`` CLI and the real ``temporal`` CLI against that server.
"""

from __future__ import annotations

from temporal_fixtures import client, dev_server, task_queue  # noqa: E402,F401  (shared fixtures)
