"""A live upgrade: a batch started by the previous release is finished by the current code.

The previous release (``tests/golden/PREVIOUS_RELEASE``) is installed from this clone's git
history into its own venv (``old_release.py``). Its CLI starts a batch of long rollouts and its
worker runs them; the old worker is SIGKILLed mid-agent and a worker of the tree under test
finishes every rollout (graded exactly once, counted by the env on disk). Then the current
``rollouts resume`` re-runs the one rollout that could not be graded, and the job succeeds.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import old_release
import pytest
from temporal_helpers import ENV_FILE, WorkerProcess, async_wait_for, read_lines

from durable_rollouts.release import MEMO_KEY, release_name
from durable_rollouts.temporal.batches import get_job
from durable_rollouts.workflows import workflow_id

pytestmark = pytest.mark.timeout(150)

ROWS = 3
AGENT_SECONDS = 4.0


def _tasks(evidence: Path) -> Path:
    """ROWS rows graded into grades.log, one more into late/grades.log (missing: grade errors)."""
    def row(tag: str, log: Path) -> dict[str, object]:
        return {"env": "counting", "id": "echo", "source": ENV_FILE, "args": {
            "expected": "x", "tag": tag, "grade_log": str(log), "pid_file": str(evidence / f"{tag}.pid")}}

    rows = [row(f"r{i}", evidence / "grades.log") for i in range(ROWS)]
    rows.append(row("late", evidence / "late" / "grades.log"))
    path = evidence / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _old_cli(python: Path, home: Path, *args: str) -> str:
    out = subprocess.run([str(python), "-m", "durable_rollouts.cli", *args], cwd=home,
                         env=old_release.old_env(home), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"old release CLI {args[:1]} failed: {out.stderr[-3000:]}"
    return out.stdout


async def _identities(client, wid: str) -> set[str]:
    history = await client.get_workflow_handle(wid).fetch_history()
    return {e.workflow_task_completed_event_attributes.identity for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")}


async def test_a_batch_of_the_previous_release_finishes_on_the_current_worker_and_resumes(
        dev_server, client, tmp_path: Path) -> None:
    """SIGKILL the previous release's worker mid-agent: a current worker finishes every rollout
    with the right reward, graded once; the current `rollouts resume` then completes the job."""
    t0 = time.monotonic()
    python, install_s = old_release.install()
    home = python.parents[2]
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    queue = f"upgrade-{uuid.uuid4().hex[:8]}"
    old = WorkerProcess(dev_server.address, queue, env=old_release.old_env(home), python=str(python),
                        cwd=str(home))
    new = None
    try:
        started = json.loads(_old_cli(
            python, home, "run", str(_tasks(evidence)), "--agent", "sleep", "--agent-config",
            json.dumps({"seconds": AGENT_SECONDS, "answer": "x"}), "--runtime", f"subprocess:{ENV_FILE}",
            "--temporal", dev_server.address, "--task-queue", queue, "--detach", "--json"))
        job_id = started["job_id"]
        pids = [evidence / f"r{i}.pid" for i in range(ROWS)] + [evidence / "late.pid"]
        await async_wait_for(lambda: all(p.exists() for p in pids), timeout=40, what="agents running")
        await asyncio.sleep(1.0)
        old.kill()
        assert not read_lines(evidence / "grades.log"), "the old worker graded before it was killed"
        new = WorkerProcess(dev_server.address, queue)
        job = await asyncio.wait_for(get_job(job_id, temporal=client, wait=True), 60)

        by_tag = {r.rollout_id: r for r in job.runs}
        assert len(by_tag) == ROWS + 1
        ok = [r for r in job.runs if r.status == "succeeded"]
        assert len(ok) == ROWS and [r.reward for r in ok] == [1.0] * ROWS, [r.error for r in job.runs]
        (late,) = [r for r in job.runs if r.status != "succeeded"]
        assert late.error_phase == "grading", late.error
        assert len(read_lines(evidence / "grades.log")) == ROWS  # each graded exactly once
        ours = release_name()
        for run in ok:  # the old worker started them, the current one (named by its identity) ended them
            seen = await _identities(client, run.rollout_id)
            assert any(i.startswith(ours) for i in seen) and not all(i.startswith(ours) for i in seen), seen

        (evidence / "late").mkdir()
        resume = subprocess.run([sys.executable, "-m", "durable_rollouts.cli", "resume", job_id,
                                 "--temporal", dev_server.address, "--json"],
                                capture_output=True, text=True, timeout=60)
        assert resume.returncode == 0, resume.stderr[-3000:]
        again = await get_job(job_id, temporal=client)
        assert [r.status for r in again.runs] == ["succeeded"] * (ROWS + 1)
        assert [r.reward for r in again.runs] == [1.0] * (ROWS + 1)
        assert len(read_lines(evidence / "late" / "grades.log")) == 1
        assert len(read_lines(evidence / "grades.log")) == ROWS  # kept, not re-run
        memo = await (await client.get_workflow_handle(workflow_id(job_id)).describe()).memo()
        assert memo[MEMO_KEY] == ours  # the resumed run names the release that started it
    finally:
        old.stop()
        if new is not None:
            new.stop()
    print(f"upgrade test: old release installed in {install_s:.2f}s (0 = cached), "
          f"total {time.monotonic() - t0:.1f}s")


def test_a_clone_without_the_previous_release_fails_saying_how_to_fetch_it(tmp_path: Path) -> None:
    """A shallow clone lacks PREVIOUS_RELEASE: the upgrade test fails with the fix, never skips."""
    repo = old_release.repo_root()
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True)
    with pytest.raises(AssertionError, match="shallow clone: run `git fetch --unshallow`"):
        old_release.resolve(shallow, old_release.previous_commit())
    assert old_release.resolve(repo, old_release.previous_commit()) == old_release.previous_commit()
