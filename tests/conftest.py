"""Shared test configuration: the test session gets a private ROLLOUTS_HOME.

Set at import time, before any durable_rollouts module reads it, so tests (and the worker and
env subprocesses they start, which inherit the environment) never touch a user's real state.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

os.environ["ROLLOUTS_HOME"] = tempfile.mkdtemp(prefix="rollouts-test-")


# The fast lane (`pytest -m "not slow"`, under 2 minutes on 2 cores) leaves out these: crash,
# chaos and upgrade tests that SIGKILL real processes and wait out heartbeat timeouts, the storage
# matrix, Docker and the CLI end to end. The workflow's shape (tests/workflows, test_card_steps,
# the golden replays), the protocol, env server, sdk and stream tests stay in it. CI runs all.
SLOW = (
    "agents/", "chaos/", "storage/", "golden/test_upgrade_live.py", "golden/test_upgrade_stream.py",
    "golden/test_nondeterminism.py",
    "temporal/test_survival.py", "temporal/test_busy_queue.py", "temporal/test_eviction.py", "temporal/test_gc_sweep.py",
    "temporal/test_admission.py", "temporal/test_fan_out.py", "temporal/test_stream_parts.py",
    "training/test_stream_burst.py",
    "temporal/test_durable_path.py", "temporal/test_plugin.py", "temporal/test_embedded_server.py",
    "temporal/test_worker_lifetime.py", "temporal/test_epochs.py", "temporal/test_slow_env_import.py",
    "providers/test_docker", "providers/test_daytona.py",
    "providers/test_ssh.py", "cli/", "training/test_cli_", "training/test_replay.py",
    "training/test_regrade.py", "training/test_grpo", "training/test_visibility.py",
    "training/test_policies.py", "hud_v6/", "test_cli_task.py", "sdk/test_direct.py",
    "fuzz/test_protocol_states.py", "fuzz/test_frame_fuzz.py", "training/test_atif_exports.py",
    "training/test_exports.py", "providers/test_hud.py", "providers/test_modal.py",
    "seeds/test_durable_seeds.py", "capabilities/test_openai_chat_agent.py",
    "sdk/test_substrate_tokens.py", "sdk/test_steps_multiprocess.py",
)


def pytest_collection_modifyitems(config: object, items: list) -> None:  # type: ignore[type-arg]
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    for item in items:
        path = str(item.fspath)
        relative = path[len(here):] if path.startswith(here) else path
        if relative.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


# `pytest -n 2` (the README's command; pytest-xdist): whole files go to one process each, so a
# file's module fixtures start once and its tests keep their order; the Docker tests all go to
# one, since they list and sweep every test container of the engine. Each process has its own
# ROLLOUTS_HOME (above) and its own dev servers. (xdist's ``--dist loadgroup`` marks do not take
# on pytest 9.2, whose node ids ignore the suffix xdist adds; this hook is xdist's own.)
DOCKER_FILES = "tests/providers/test_docker"


@pytest.hookimpl(optionalhook=True)  # without xdist installed, never called
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "docker" if path.startswith(DOCKER_FILES) else path

    return FileScheduling(config, log)
