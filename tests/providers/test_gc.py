"""gc over SubprocessRuntime substrates (H3's ``$ROLLOUTS_HOME/substrates/<key>/state.json``).

Container gc is tested in test_docker.py (dead owner) and test_docker_durable.py (closed
workflow, asked of a real Temporal server).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from substrates_support import ENV_IMAGE_DIR

from durable_rollouts.envserver import load_environment
from durable_rollouts.gc import (
    collect,
    find_orphans,
    format_orphans,
    owner_labels,
    workflow_for_key,
)
from durable_rollouts.runtimes.subprocess import SubprocessRuntime, substrate_dir

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


def _wait_dead(pid: int) -> None:
    import time

    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            return
        time.sleep(0.05)


async def test_gc_removes_the_state_of_a_dead_subprocess_substrate_and_keeps_a_live_one():
    runtime = SubprocessRuntime(str(ENV_IMAGE_DIR / "env.py"))
    prefix = f"gc-{uuid.uuid4().hex[:6]}"
    live = await runtime.acquire(ENV.templates["count_letter"](), f"{prefix}-live")
    dead = await runtime.acquire(ENV.templates["count_letter"](), f"{prefix}-dead")
    try:
        os.kill(dead.handle["pid"], signal.SIGKILL)
        _wait_dead(dead.handle["pid"])
        orphans = await find_orphans(prefix=prefix)
        assert [(o.kind, o.key, o.reason) for o in orphans] == [
            ("subprocess", f"{prefix}-dead", "process already dead")
        ]
        assert "would remove subprocess" in format_orphans(orphans, dry_run=True)
        await collect(prefix=prefix)
        assert not substrate_dir(f"{prefix}-dead").exists()
        assert (substrate_dir(f"{prefix}-live") / "state.json").exists()
    finally:
        await runtime.release(live)
        await runtime.release(dead)


def test_owner_labels_name_the_rollout_workflow_of_a_durable_key():
    key = "job-abc-count_letter-1a2b3c4d-0-a2"  # attempt 2 of a Rollout workflow
    assert workflow_for_key(key) == "job-abc-count_letter-1a2b3c4d-0"
    labels = owner_labels(key, slug="count_letter-1a2b3c4d", run_timeout_s=60)
    assert labels["durable-rollouts.workflow"] == "job-abc-count_letter-1a2b3c4d-0"
    assert labels["durable-rollouts.job"] == "abc"
    assert (
        labels["durable-rollouts.owner"] == str(os.getpid()) and labels["durable-rollouts.deadline"]
    )
    assert workflow_for_key("direct-run-0") == ""
