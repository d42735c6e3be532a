"""Which task queue a batch runs on (``temporal/queues.py``, issue #39 item 4)."""

from __future__ import annotations

import pytest

from durable_rollouts.temporal.queues import batch_queue, chosen_queue, job_queue


def test_a_process_with_its_own_worker_gets_the_jobs_own_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTS_TASK_QUEUE", raising=False)
    assert chosen_queue() is None
    assert batch_queue(None, job_id="abc", in_process=True) == job_queue("abc") == "rollouts-job-abc"
    assert batch_queue(None, job_id="abc", in_process=False) == "rollouts"  # cluster workers poll it


@pytest.mark.parametrize("in_process", [True, False])
def test_a_chosen_queue_is_kept_for_scale_out(monkeypatch: pytest.MonkeyPatch, in_process: bool) -> None:
    monkeypatch.delenv("ROLLOUTS_TASK_QUEUE", raising=False)
    assert batch_queue("shared", job_id="abc", in_process=in_process) == "shared"
    monkeypatch.setenv("ROLLOUTS_TASK_QUEUE", "team")
    assert batch_queue(None, job_id="abc", in_process=in_process) == "team"
    assert batch_queue("mine", job_id="abc", in_process=in_process) == "mine"
    monkeypatch.setenv("ROLLOUTS_TASK_QUEUE", "")  # empty counts as unset
    assert batch_queue(None, job_id="abc", in_process=in_process) == (
        "rollouts-job-abc" if in_process else "rollouts")
