"""A ``rollouts export`` file written by the previous release re-grades with this one.

``tests/training/exports/0.1.0-c39e162-letters.jsonl`` was written by release c39e162 (before the
move to runtimes/, steps/, client/ and stores/): ``rollouts run examples/letters/env.py --agent
table ... --group 2`` then ``rollouts export JOB --format jsonl``. Its rows name the env file by
the absolute path of the machine that wrote it, so the re-grade points ``grader=`` at this
checkout's copy of the same env. Real dev server, real env server.
"""

from __future__ import annotations

import json
from pathlib import Path

from history_scan import step_names

from durable_rollouts.sdk.taskset import Taskset

REPO = Path(__file__).resolve().parents[2]
EXPORT = REPO / "tests/training/exports/0.1.0-c39e162-letters.jsonl"
LETTERS = str(REPO / "examples/letters/env.py")
CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]


async def test_the_previous_releases_export_regrades_to_the_same_rewards(client, task_queue) -> None:
    saved = [json.loads(line) for line in EXPORT.read_text().splitlines() if line.strip()]
    assert len(saved) == 8 and {s["job_id"] for s in saved} == {"2962eec841564fe7b7bc787966b11f00"}

    replay = await Taskset.replay(EXPORT)
    job = await replay.run(grader=LETTERS, temporal=client, worker=True, task_queue=task_queue)

    # the table agent had no answer for "vowels": those two are skipped, with the reason
    assert sorted(s.rollout_id.split("-")[2] for s in replay.skipped) == ["vowels", "vowels"]
    assert all("no answer to re-grade" in s.skip_reason for s in replay.skipped)
    assert len(job.runs) == 6
    assert [r.status for r in job.runs] == ["succeeded"] * 6, [r.error for r in job.runs]
    by_id = {s["rollout_id"]: s for s in saved if s["answer"] is not None}
    for run in job.runs:
        original = by_id[run.trace.extra["regrade"]["rollout_id"]]
        assert run.reward == original["reward"] and run.trace.content == original["answer"]
    assert sorted({r.trace.extra["regrade"]["rollout_id"] for r in job.runs}) == sorted(by_id)
    assert replay.compare(job).changed == []
    for run in job.runs:
        assert step_names(await client.get_workflow_handle(run.rollout_id).fetch_history()) == CARD
