"""Shared test configuration: the test session gets a private ROLLOUTS_HOME.

Set at import time, before any durable_rollouts module reads it, so tests (and the worker and
env subprocesses they start, which inherit the environment) never touch a user's real state.
"""

from __future__ import annotations

import os
import tempfile

os.environ["ROLLOUTS_HOME"] = tempfile.mkdtemp(prefix="rollouts-test-")
