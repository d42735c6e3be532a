"""Fixtures of the seed tests: the shared Temporal dev server fixtures (Taskset.run's durable path)."""

from __future__ import annotations

from temporal_fixtures import client, dev_server, task_queue  # noqa: F401  (shared fixtures)
