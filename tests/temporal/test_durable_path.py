"""The durable path end to end on a real dev server with an in-process worker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from temporal_helpers import ENV_FILE, BigTraceAgent, CountingAgent, read_lines

from durable_rollouts import session
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.agents import FailAgent, FixedAgent, SleepAgent
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job, run_taskset, start_job
from durable_rollouts.workflows import TasksetRun, workflow_id


def echo(expected: str, **args: object) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected, **args}, source=ENV_FILE)


async def test_workflows_import_no_io_layers() -> None:
    """Importing durable_rollouts.workflows loads no envserver, sdk or activities module."""
    code = ("import sys, durable_rollouts.workflows; "
            "print(' '.join(m for m in sys.modules if m.startswith('durable_rollouts')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.split()
    assert "durable_rollouts.workflows" in loaded
    assert not [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in ("envserver", "sdk", "activities", "worker")]


async def test_batch_grades_every_rollout_and_groups_share_ids(client, task_queue) -> None:
    """rows x group rollouts run task-major; a row's repeats share one group id."""
    ts = Taskset("echoes", [echo("a"), echo("b")])
    async with session():  # the worker outlives the batch: the query below needs one
        job = await run_taskset(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=3,
                                temporal=client, worker=True, task_queue=task_queue)
        progress = await client.get_workflow_handle(workflow_id(job.id)).query(TasksetRun.progress)
    assert [r.status for r in job.runs] == ["succeeded"] * 6
    assert [r.reward for r in job.runs] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert len({r.group_id for r in job.runs[:3]}) == 1 and job.runs[0].group_id != job.runs[3].group_id
    assert [r.group_index for r in job.runs] == [0, 1, 2, 0, 1, 2]
    assert job.runs[0].rollout_id == f"job-{job.id}-{ts.tasks[0].slug}-0"
    assert job.runs[0].trace.content == "a" and job.runs[0].prompt
    assert (progress.total, progress.succeeded, progress.done, progress.mean_reward) == (6, 6, True, 0.5)


async def test_progress_query_counts_running_rollouts(client, task_queue) -> None:
    """While a batch runs, the progress query reports running and finished rollouts."""
    ts = Taskset("echoes", [echo("a"), echo("b"), echo("c")])
    handle = await start_job(ts, SleepAgent(seconds=1.0, answer="a"), runtime=LocalRuntime(ENV_FILE),
                             max_concurrent=2, temporal=client, worker=True, task_queue=task_queue)
    seen = []
    while True:
        p = await handle.progress()
        seen.append((p.running, p.finished))
        if p.done:
            break
        await asyncio.sleep(0.2)
    assert max(r for r, _ in seen) == 2  # max_concurrent respected
    assert seen[-1] == (0, 3)
    job = await handle.wait()
    assert sorted(r.reward for r in job.runs) == [0.0, 0.0, 1.0]


async def test_agent_failure_is_graded_and_counted_not_raised(client, task_queue) -> None:
    """An agent that raises still gets graded; the run is errored with the agent's message."""
    ts = Taskset("echoes", [echo("a")])
    job = await run_taskset(ts, FailAgent(message="boom"), runtime=LocalRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert run.status == "errored" and run.error_phase == "agent loop" and "boom" in (run.error or "")
    assert run.grade is not None and run.grade_reward == 0.0 and run.reward is None  # graded, but no reward


async def test_unknown_task_fails_fast_without_retries(client, task_queue) -> None:
    """A task id the env does not define is a ConfigError: the rollout fails at start, no retry loop."""
    ts = Taskset("bad", [Task(env="counting", id="nope", source=ENV_FILE)])
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    job = await run_taskset(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert (run.status, run.error_phase) == ("failed", "starting task"), run.error
    assert "ConfigError" in run.error
    assert loop.time() - t0 < 5


async def test_trace_stays_out_of_history_claim_check(client, task_queue) -> None:
    """A 1 MB trace travels by reference: no workflow history grows by anything near 1 MB."""
    ts = Taskset("big", [echo("x")])
    job = await run_taskset(ts, BigTraceAgent(size=1_000_000), runtime=LocalRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert run.trace_ref is not None and run.trace_ref.size > 1_000_000
    assert sum(len(str(m)) for s in run.trace.steps for m in s.messages) > 1_000_000
    for wid in (workflow_id(job.id), run.rollout_id):
        history = await client.get_workflow_handle(wid).fetch_history()
        assert len(history.to_json()) < 100_000, wid


async def test_open_job_accumulates_batches_findable_by_id(client, task_queue) -> None:
    """Job.start + several runs: each batch is its own workflow; get_job finds them all."""
    session = await Job.start("grpo", group=2)
    ts = Taskset("echoes", [echo("a")])
    for _ in range(2):
        await run_taskset(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
                          job=session, temporal=client, worker=True, task_queue=task_queue)
    assert len(session.runs) == 4 and session.batches == 2
    assert session.runs[2].rollout_id.endswith("-b1")
    again = await get_job(session.id, temporal=client)
    assert again.name == "grpo" and sorted(r.rollout_id for r in again.runs) == sorted(
        r.rollout_id for r in session.runs)


async def test_subprocess_runtime_rollouts_are_pinned_and_torn_down(client, task_queue, evidence: Path) -> None:
    """A host-local substrate (subprocess) runs, is graded once per rollout, and is removed."""
    log = evidence / "grades.log"
    agents = evidence / "agents.log"
    ts = Taskset("echoes", [echo("a", grade_log=str(log), tag="r0"), echo("a", grade_log=str(log), tag="r1")])
    job = await run_taskset(ts, CountingAgent(answer="a", log=str(agents)), runtime=SubprocessRuntime(ENV_FILE),
                            temporal=client, worker=True, task_queue=task_queue)
    assert [r.reward for r in job.runs] == [1.0, 1.0]
    assert len(read_lines(log)) == 2 and len(read_lines(agents)) == 2


async def test_long_batch_continues_as_new_and_keeps_every_result(client, task_queue) -> None:
    """A batch whose history outgrows its limit continues-as-new (draining children first),
    flushes results to the result store and still returns every rollout exactly once."""
    ts = Taskset("many", [echo(str(i)) for i in range(6)])
    handle = await start_job(ts, FixedAgent(answer="1"), runtime=LocalRuntime(ENV_FILE), group=2,
                             max_concurrent=3, temporal=client, worker=True, task_queue=task_queue,
                             max_history_events=40)
    job = await handle.wait()
    assert len(job.runs) == 12 and len({r.rollout_id for r in job.runs}) == 12
    assert [r.reward for r in job.runs] == [0.0, 0.0, 1.0, 1.0] + [0.0] * 8
    progress = await handle.progress()
    assert progress.runs > 1 and progress.finished == 12 and progress.done
    result = await handle.handle.result()
    assert result.result_refs  # flushed chunks carried as claim checks


async def test_histories_replay_deterministically(client, task_queue, evidence: Path) -> None:
    """The recorded histories of a batch (parent and children) replay without nondeterminism."""
    from temporalio.worker import Replayer

    from durable_rollouts.temporal.codec import data_converter
    from durable_rollouts.workflows import Rollout

    ts = Taskset("echoes", [echo("a"), echo("b", grade_log=str(evidence / "g.log"))])
    job = await run_taskset(ts, FailAgent(), runtime=SubprocessRuntime(ENV_FILE), group=2,
                            temporal=client, worker=True, task_queue=task_queue)
    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    for wid in [workflow_id(job.id)] + [r.rollout_id for r in job.runs]:
        history = await client.get_workflow_handle(wid).fetch_history()
        await replayer.replay_workflow(history)


async def test_batch_is_searchable_by_job_id_with_status(client, task_queue) -> None:
    """The batch and its rollouts carry the Rollouts* search attributes (Web UI / list filters)."""
    ts = Taskset("echoes", [echo("a")])
    job = await run_taskset(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
                            temporal=client, worker=True, task_queue=task_queue, name="searchable")
    seen: dict[str, str] = {}
    for _ in range(50):  # visibility is eventually consistent
        seen = {wf.id: wf.workflow_type async for wf in client.list_workflows(f'RolloutsJobId = "{job.id}"')}
        if len(seen) == 3:
            break
        await asyncio.sleep(0.1)
    assert sorted(seen.values()) == ["Rollout", "Rollout", "TasksetRun"]
    parents: list = []
    for _ in range(50):  # the final status upsert is eventually visible too
        parents = [wf async for wf in client.list_workflows(
            f'RolloutsJobName = "searchable" AND RolloutsStatus = "completed" AND RolloutsJobId = "{job.id}"')]
        if parents:
            break
        await asyncio.sleep(0.1)
    assert [wf.id for wf in parents] == [workflow_id(job.id)]


class PickSecond(Taskset):
    """resolve_task swaps the row for another expected answer; one row cannot resolve."""

    def resolve_task(self, task: Task) -> Task:
        if task.args["expected"] == "broken":
            from durable_rollouts.errors import ConfigError

            raise ConfigError("no problem for this row")
        return task.model_copy(update={"args": {**task.args, "expected": "z"}})


async def test_groups_resolve_once_and_unresolvable_groups_fail_alone(client, task_queue) -> None:
    """resolve_task runs once per group on the worker; a group that cannot resolve fails by itself."""
    ts = PickSecond("lazy", [echo("a"), echo("broken")])
    job = await run_taskset(ts, FixedAgent(answer="z"), runtime=LocalRuntime(ENV_FILE), group=2,
                            temporal=client, worker=True, task_queue=task_queue)
    assert [r.status for r in job.runs] == ["succeeded", "succeeded", "failed", "failed"]
    assert [r.reward for r in job.runs[:2]] == [1.0, 1.0]
    assert job.runs[2].error_phase == "resolving" and "no problem" in job.runs[2].error


async def test_large_taskset_rows_travel_by_claim_check(client, task_queue, monkeypatch) -> None:
    """Above INLINE_ROWS rows the workflow input carries a file reference, not the rows; rows
    are loaded in windows (also across continue-as-new) and every rollout still runs once."""
    from durable_rollouts.temporal import batches as orchestrate

    monkeypatch.setattr(orchestrate, "INLINE_ROWS", 2)
    ts = Taskset("many", [echo(str(i)) for i in range(7)])
    handle = await start_job(ts, FixedAgent(answer="3"), runtime=LocalRuntime(ENV_FILE), max_concurrent=2,
                             temporal=client, worker=True, task_queue=task_queue, max_history_events=40)
    job = await handle.wait()
    assert [r.reward for r in job.runs] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    history = await handle.handle.fetch_history()  # the latest run after continue-as-new
    started = history.events[0].workflow_execution_started_event_attributes
    assert b'"rows_ref":"rollouts-storage:' in started.input.payloads[0].data
    assert b'"rows":[]' in started.input.payloads[0].data


async def test_only_slots_run_for_a_resume_with_stable_rollout_ids(client, task_queue) -> None:
    """TasksetRunInput.only runs just the listed (row, group) slots under their stable rollout ids."""
    from durable_rollouts.workflows import TasksetRunInput, rollout_id

    ts = Taskset("echoes", [echo("a"), echo("b"), echo("c")])
    async with session():  # the in-process worker also runs the raw workflow started below
        job = await run_taskset(ts, FixedAgent(answer="b"), runtime=LocalRuntime(ENV_FILE), group=2,
                                temporal=client, worker=True, task_queue=task_queue)
        first = await client.get_workflow_handle(workflow_id(job.id)).describe()
        inp = TasksetRunInput(job_id=job.id, rows=ts.tasks, group=2, agent=FixedAgent(answer="b").spec(),
                              provider=LocalRuntime(ENV_FILE).spec(), task_queue=task_queue,
                              only=[(0, 1), (2, 0)], batch_index=0)
        handle = await client.start_workflow(TasksetRun.run, inp, id=f"resume-{job.id}", task_queue=task_queue)
        result = await handle.result()
    assert sorted(r.rollout_id for r in result.results) == sorted(
        [rollout_id(job.id, ts.tasks[0].slug, 1), rollout_id(job.id, ts.tasks[2].slug, 0)])
    assert result.progress.total == 2 and first.status is not None
