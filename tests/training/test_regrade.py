"""Re-grading saved rollouts without re-running agents (``Taskset.replay``), on a real dev server
and real env servers: the env grades the saved answers anew (a changed grader changes the
rewards), the agent is never called (its call log does not grow), every Rollout of the re-grade
job still records the card's steps, each run links to the rollout it re-graded, rollouts without
an answer are skipped with their reason, and an exported JSONL file replays like the job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from history_scan import step_names
from temporal_helpers import ENV_FILE
from training_agents import PolicyAgent

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.sdk.taskset import Taskset

GRADER = str(Path(__file__).resolve().parent / "regrade_env.py")
CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]


def echo(expected: str, grade_log: Path, **extra: object) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected, "grade_log": str(grade_log)},
                source=ENV_FILE, **extra)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def histories(client, job) -> list[list[str]]:
    return [step_names(await client.get_workflow_handle(run.rollout_id).fetch_history())
            for run in job.runs]


async def test_regrade_of_a_job_id_grades_saved_answers_anew_without_calling_the_agent(
        client, task_queue, tmp_path) -> None:
    """A job of 3 tasks x 2 (one member of "c" fails: no answer) re-graded by job id with a
    changed grader: the 5 answered rollouts get the new reward (0.25), the env graded each once
    more, the agent's call log does not grow, every Rollout records the card's steps, each run
    links to its original and keeps its trajectory, groups stay groups, and the one without an
    answer is skipped with its reason."""
    calls, grades = tmp_path / "calls.log", tmp_path / "grades.log"
    rows = [echo(e, grades) for e in ("a", "b", "c")]
    original = await Taskset("orig", rows).run(
        PolicyAgent(fail_expected=["c"], fail_members=[1], log=str(calls)),
        runtime=LocalRuntime(ENV_FILE), group=2, temporal=client, worker=True, task_queue=task_queue)
    assert [r.reward for r in original.runs] == [1.0, 1.0, 1.0, 1.0, 1.0, None]
    assert len(lines(calls)) == 6 and len(lines(grades)) == 6

    replay = await Taskset.replay(original.id, temporal=client)
    (skipped,) = replay.skipped
    assert skipped.rollout_id == original.runs[5].rollout_id
    assert "no answer to re-grade (it errored in agent loop" in skipped.skip_reason
    assert len(replay.rollouts) == 5 and replay.name == "orig-regrade"

    job = await replay.run(grader=GRADER, temporal=client, worker=True, task_queue=task_queue)

    assert len(lines(calls)) == 6  # the agent was never called
    assert [line.split()[0] for line in lines(grades)[6:]] == ["v2"] * 5  # the new env graded 5
    assert job.id != original.id and job.batches == 2  # "c" has one answered member: own batch
    assert [(r.slug, r.status, r.reward) for r in job.runs] == [
        (original.runs[i].slug, "succeeded", 0.25) for i in range(5)]
    assert all(names == CARD for names in await histories(client, job))
    by_id = {r.rollout_id: r for r in original.runs}
    for run in job.runs:
        link = run.trace.extra["regrade"]
        old = by_id[link["rollout_id"]]
        assert (link["job_id"], link["reward"], link["status"]) == (original.id, 1.0, "succeeded")
        assert run.trace.content == old.trace.content
        assert [s.model_dump(exclude={"started_at", "ended_at"}) for s in run.trace.steps] == [
            s.model_dump(exclude={"started_at", "ended_at"}) for s in old.trace.steps]
    assert len(job.groups) == 3 and sorted(len(g) for g in job.groups.values()) == [1, 2, 2]
    summary = replay.compare(job)
    assert (len(summary.rollouts), len(summary.changed)) == (5, 5)
    assert (summary.old_reward, summary.new_reward) == (1.0, 0.25)
    assert [s["rollout_id"] for s in summary.to_dict()["skipped"]] == [skipped.rollout_id]


async def test_a_rollout_the_new_grader_rejects_is_errored_and_counts_as_changed(
        client, task_queue, tmp_path) -> None:
    """The new grader raises for one task: that re-graded rollout is errored at grading (no
    reward) and the comparison counts it as changed, next to the other one's new reward."""
    grades = tmp_path / "grades.log"
    original = await Taskset("boom", [echo("a", grades), echo("boom", grades)]).run(
        PolicyAgent(), runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
        task_queue=task_queue)
    replay = await Taskset.replay(original)
    job = await replay.run(grader=GRADER, temporal=client, worker=True, task_queue=task_queue)
    assert [(r.status, r.reward, r.error_phase) for r in job.runs] == [
        ("succeeded", 0.25, None), ("errored", None, "grading")]
    assert "this grader rejects boom" in (job.runs[1].error or "")
    summary = replay.compare(job)
    assert [(c.old_reward, c.new_reward, c.new_status) for c in summary.changed] == [
        (1.0, 0.25, "succeeded"), (1.0, None, "errored")]
    assert (summary.old_reward, summary.new_reward) == (1.0, 0.25)


async def test_regrade_from_an_exported_jsonl_file_runs_the_verifier_again(
        client, task_queue, tmp_path) -> None:
    """A job whose task has a verifier, exported with Job.export and replayed from the file:
    grade and verify run again (the Rollout records verify_open, verify, verify_close), the
    rewards are unchanged (same env), and the agent is not called."""
    calls, grades = tmp_path / "calls.log", tmp_path / "grades.log"
    referee = Task(env="referee", id="referee", args={"expected": "a", "grade_log": str(grades)},
                   source=ENV_FILE)
    original = await Taskset("verified", [echo("a", grades, verifier=referee)]).run(
        PolicyAgent(log=str(calls)), runtime=LocalRuntime(ENV_FILE), group=2, temporal=client,
        worker=True, task_queue=task_queue)
    exported = original.export(tmp_path / "runs.jsonl")
    before = len(lines(grades))

    replay = await Taskset.replay(exported)
    job = await replay.run(runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
                           task_queue=task_queue)

    assert len(lines(calls)) == 2
    assert len(lines(grades)) == before + 4  # echo and referee graded each rollout once more
    assert [r.reward for r in job.runs] == [1.0, 1.0] and replay.name == "runs-regrade"
    expected = ["provision", "connect", "start", "agent", "grade", "verify_open", "verify",
                "verify_close", "teardown"]
    assert all(names == expected for names in await histories(client, job))
    assert [r.trace.extra["regrade"]["rollout_id"] for r in job.runs] == [
        r.rollout_id for r in original.runs]
    assert replay.compare(job).changed == []


async def test_bad_replay_input_is_one_config_error(client, task_queue, tmp_path) -> None:
    """An unknown job id, a missing file, a file that is not a jsonl export, a grader that is
    missing or lacks the task, a grader on a runtime that cannot serve it, and a Job object
    without a runtime: each a ConfigError before anything runs."""
    with pytest.raises(ConfigError, match="no job with id 'nope-nope'"):
        await Taskset.replay("nope-nope", temporal=client)
    with pytest.raises(ConfigError, match="export file not found"):
        await Taskset.replay(tmp_path / "missing.jsonl")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [], "reward": 1.0}) + "\n")
    with pytest.raises(ConfigError, match="line 1 is not a rollout record: it has no rollout_id"):
        await Taskset.replay(chat)
    grades = tmp_path / "grades.log"
    original = await Taskset("bad", [echo("a", grades)]).run(
        PolicyAgent(), runtime=LocalRuntime(ENV_FILE), temporal=client, worker=True,
        task_queue=task_queue)
    replay = await Taskset.replay(original)
    with pytest.raises(ConfigError, match="grader file not found"):
        await replay.run(grader=tmp_path / "nope.py", temporal=client)
    lacking = tmp_path / "other_env.py"
    lacking.write_text("from durable_rollouts.envserver import Environment\n"
                       "env = Environment(name='counting')\n"
                       "@env.template()\nasync def other():\n    yield 'x'\n    yield 1.0\n")
    with pytest.raises(ConfigError, match="has no task echo"):
        await replay.run(grader=lacking, temporal=client)
    with pytest.raises(ConfigError, match="local or subprocess runtime"):
        await replay.run(grader=GRADER, runtime=DockerRuntime("img"), temporal=client)
    with pytest.raises(ConfigError, match="needs runtime="):
        await replay.run(temporal=client)
    assert len(lines(grades)) == 1  # nothing ran
