"""The workflow side of `rollouts resume`: a TasksetRun started with ``only`` runs exactly those
(row, group index) slots under their original rollout ids and returns them with the kept results."""

from __future__ import annotations

import uuid

from cli_helpers import LETTERS
from flaky_agent import FlakyAgent

from durable_rollouts import session
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job, run_taskset
from durable_rollouts.temporal.connection import connect_client
from durable_rollouts.temporal.jobs import load_job
from durable_rollouts.temporal.resume import plan_resume, start_resume
from durable_rollouts.worker import build_worker


async def test_a_resumed_batch_runs_only_the_selected_slots_and_keeps_the_rest(
    embedded_server, tmp_path
) -> None:
    client = await connect_client(embedded_server.address)
    queue = f"cli-resume-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "agent.log"
    agent = FlakyAgent(
        answers={"count_letter": "3"},
        fail_ids=["vowels"],
        marker=str(tmp_path / "marker"),
        log=str(log),
    )
    taskset = Taskset.from_file(LETTERS)
    async with session():  # the in-process worker also runs the resume workflow below
        job = await run_taskset(
            taskset,
            agent,
            runtime=LocalRuntime(str(LETTERS)),
            group=2,
            temporal=client,
            worker=True,
            task_queue=queue,
        )
        failed = sorted(r.rollout_id for r in job.runs if r.status != "succeeded")
        assert len(failed) == 2 and all("vowels" in rid for rid in failed)

        (tmp_path / "marker").touch()
        log.write_text("")
        (plan,) = plan_resume(await load_job(client, job.id), None)
        assert sorted(r.rollout_id for r in plan.rerun) == failed and len(plan.kept) == 6
        handle = await start_resume(client, job.id, plan)
        result = await handle.result()

        assert sorted(log.read_text().split()) == failed  # only the selected slots ran
        ids = [r.rollout_id for r in result.results]
        assert len(ids) == 8 and len(set(ids)) == 8
        assert (
            result.progress.total == 8 and result.progress.succeeded == 8 and result.progress.done
        )
        again = await get_job(job.id, temporal=client)
        assert sorted(r.rollout_id for r in again.runs) == sorted(r.rollout_id for r in job.runs)
        assert all(r.status == "succeeded" for r in again.runs)
        assert handle.id == f"job-{job.id}"  # the same workflow id: found by the job id


async def test_resume_carries_kept_results_by_claim_check_when_there_are_many(
    embedded_server, tmp_path, monkeypatch
) -> None:
    """Above INLINE_KEPT_MAX kept results travel as a result-store chunk, not in the workflow input."""
    from durable_rollouts.temporal import resume

    monkeypatch.setattr(resume, "INLINE_KEPT_MAX", 2)
    client = await connect_client(embedded_server.address)
    queue = f"cli-resume-{uuid.uuid4().hex[:8]}"
    agent = FlakyAgent(
        answers={"count_letter": "3"}, fail_ids=["reverse_word"], marker=str(tmp_path / "marker")
    )
    worker = build_worker(client, task_queue=queue)
    async with worker:
        job = await run_taskset(
            Taskset.from_file(LETTERS),
            agent,
            runtime=LocalRuntime(str(LETTERS)),
            temporal=client,
            worker=False,
            task_queue=queue,
        )
        (tmp_path / "marker").touch()
        (plan,) = plan_resume(await load_job(client, job.id), frozenset({"errored"}))
        handle = await start_resume(client, job.id, plan)
        result = await handle.result()
    assert (
        len(result.result_refs) == 1 and len(result.results) == 1
    )  # 3 kept by claim check, 1 re-run
    view = await load_job(client, job.id)
    assert [r.status for r in view.runs] == ["succeeded"] * 4
