"""The direct executor runs real env servers (in-process and as subprocesses) end to end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from durable_rollouts import LocalRuntime, SubprocessRuntime, Task, Taskset
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Limits, RuntimeConfig
from durable_rollouts.processes import pid_alive
from durable_rollouts.runtimes.procs import read_state
from durable_rollouts.runtimes.subprocess import substrate_dir
from durable_rollouts.sdk.agents import Agent, FailAgent, FixedAgent, SleepAgent, TableAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.run import Run

LETTER_ANSWERS = {"count_letter": "3", "reverse_word": "reward", "vowels": '["e", "u", "a", "i", "o"]'}


LETTERS = Path(__file__).resolve().parents[2] / "examples" / "letters" / "env.py"


def letters() -> Taskset:
    return Taskset.from_file(LETTERS)


def make_runtime(kind: str, path: Path):
    return LocalRuntime(path) if kind == "local" else SubprocessRuntime(path)


class EchoLength(Agent):
    """Answers with the length of the blob argument, read from the task row."""

    async def __call__(self, run: Run) -> None:
        assert run.client is not None and run.prompt_text.startswith("How long")
        run.trace.content = str(len(run.task.args["blob"]))


@pytest.mark.parametrize("kind", ["local", "subprocess"])
async def test_letters_example_runs_end_to_end(kind: str, letters_path: Path) -> None:
    ts = letters()
    job = await run_direct(ts, TableAgent(answers=LETTER_ANSWERS), make_runtime(kind, letters_path))
    assert [r.slug for r in job.runs] == ts.slugs
    # "banana" has three a's, "strawberry" three r's: every row scores 1
    assert [r.status for r in job.runs] == ["succeeded"] * 4
    assert job.reward == 1.0 and not job.errors
    assert all(r.trace_ref is not None and r.trace.content for r in job.runs)


@pytest.mark.parametrize("kind", ["local", "subprocess"])
async def test_group_of_four_shares_one_group_id_per_task(kind: str, letters_path: Path) -> None:
    ts = letters().filter(ids=["count_letter"])
    job = await run_direct(ts, FixedAgent(answer="3"), make_runtime(kind, letters_path), group=4)
    assert len(job.runs) == 8
    first, second = job.runs[:4], job.runs[4:]
    assert len({r.group_id for r in first}) == 1 and len({r.group_id for r in second}) == 1
    assert first[0].group_id != second[0].group_id
    assert [r.group_index for r in first] == [0, 1, 2, 3]
    assert len({r.rollout_id for r in job.runs}) == 8
    stats = job.group_stats()
    assert all(s.mean == 1.0 and s.std == 0.0 for s in stats.values())
    assert sorted(job.zero_spread_groups) == sorted(stats)


class PickWord(Taskset):
    """Resolves each row lazily to a fresh word, counting calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    async def resolve_task(self, task: Task) -> Task:
        self.calls.append(task.slug)
        word = ["apple", "banana"][len(self.calls) - 1]
        return task.model_copy(update={"args": {"word": word, "letter": "a"}})


async def test_lazy_taskset_resolves_once_per_group(letters_path: Path) -> None:
    base = letters().filter(ids=["count_letter"])
    ts = PickWord("lazy", base.tasks)
    job = await run_direct(ts, TableAgent(answers={}, default="1"), LocalRuntime(letters_path), group=3)
    assert sorted(ts.calls) == sorted(base.slugs)  # once per group, not per rollout
    for runs in job.groups.values():
        assert len({r.task.args["word"] for r in runs}) == 1  # one resolved task per group
    by_word = {r.task.args["word"]: r.reward for r in job.runs}
    assert by_word == {"apple": 1.0, "banana": 0.0}  # "apple" has one a, "banana" three


@pytest.mark.parametrize("kind", ["local", "subprocess"])
async def test_one_mib_task_argument_travels_over_the_socket(kind: str, echo_path: Path) -> None:
    blob = "x" * (1024 * 1024)
    ts = Taskset("big", [Task(env="echo", id="measure", args={"blob": blob}, source=str(echo_path))])
    job = await run_direct(ts, EchoLength(), make_runtime(kind, echo_path))
    run = job.runs[0]
    assert run.status == "succeeded", run.error
    assert run.reward == 1.0 and run.grade.info == {"length": len(blob)}


async def test_crashed_env_subprocess_is_reported_with_exit_code_and_output_tail(tmp_path: Path) -> None:
    env_file = tmp_path / "crash.py"
    env_file.write_text("import sys\nfor i in range(80):\n    print('noise', i)\nprint('fatal: no env here')\nsys.exit(7)\n")
    ts = Taskset("crash", [Task(env="crash", id="t", source=str(env_file))])
    job = await run_direct(ts, FixedAgent(answer="x"), SubprocessRuntime(env_file))
    run = job.runs[0]
    assert run.status == "failed" and run.error_phase == "provisioning"
    assert "exited with code 7" in run.error and "fatal: no env here" in run.error
    assert "noise 79" in run.error and "noise 10\n" not in run.error  # only the tail (50 lines)


async def test_agent_timeout_stops_the_trace_and_still_grades(letters_path: Path) -> None:
    """An agent over its ``timeout_s`` is stopped there (its answer never lands) and the env
    still grades what it got: a real grade of 0, no reward."""
    ts = letters().filter(ids=["count_letter"])
    agent = SleepAgent(seconds=30, answer="3", timeout_s=0.3)
    began = time.monotonic()
    job = await run_direct(ts, agent, LocalRuntime(letters_path))
    assert time.monotonic() - began < 15  # stopped at 0.3 s, not after the 30 s sleep
    assert [r.slug for r in job.runs] == ts.slugs and len(job.runs) == 2
    for run in job.runs:
        assert run.trace.stop_reason == "timeout" and run.trace.status == "error"
        assert not run.trace.content  # "3" would have scored 1
        assert run.grade is not None and not run.grade.is_error and run.grade_reward == 0.0
        assert run.reward is None and run.status == "errored"  # graded, but no reward
        assert run.error_phase == "agent loop" and "timed out" in run.error


async def test_failing_agent_is_recorded_and_graded_best_effort(letters_path: Path) -> None:
    ts = letters().filter(ids=["count_letter"])
    job = await run_direct(ts, FailAgent(message="model unreachable"), LocalRuntime(letters_path))
    run = job.runs[0]
    assert run.status == "errored" and run.trace.is_error
    assert (run.error, run.error_phase) == ("RuntimeError: model unreachable", "agent loop")  # as durable runs
    assert any("model unreachable" in (s.error or "") for s in run.trace.steps)
    assert run.grade is not None and run.grade_reward == 0.0 and run.reward is None  # graded, but no reward


async def test_bad_timeouts_are_rejected_before_anything_starts(letters_path: Path) -> None:
    ts = letters()
    with pytest.raises(ConfigError, match="rollout_timeout"):
        await run_direct(ts, FixedAgent(answer="3"), LocalRuntime(letters_path), rollout_timeout=0)
    with pytest.raises(ConfigError, match="shorter than rollout_timeout"):
        await run_direct(ts, FixedAgent(answer="3", timeout_s=5), LocalRuntime(letters_path), rollout_timeout=5)
    limited = Taskset("limited", [ts[0].model_copy(update={
        "runtime_config": RuntimeConfig(limits=Limits(run_timeout_s=2))})])
    with pytest.raises(ConfigError, match="run_timeout_s"):
        await run_direct(limited, FixedAgent(answer="3", timeout_s=5), SubprocessRuntime(letters_path))


async def test_runtime_config_a_provider_cannot_honour_is_rejected(letters_path: Path) -> None:
    row = letters()[0].model_copy(update={"runtime_config": RuntimeConfig(image="python:3.11")})
    with pytest.raises(ConfigError, match="image"):
        await run_direct(Taskset("img", [row]), FixedAgent(answer="3"), LocalRuntime(letters_path))
    ok = letters()[0].model_copy(update={"runtime_config": RuntimeConfig(limits=Limits(startup_timeout_s=30))})
    job = await run_direct(Taskset("ok", [ok]), FixedAgent(answer="3"), SubprocessRuntime(letters_path))
    assert job.runs[0].reward == 1.0


class SubstrateNotingSleeper(Agent):
    """Notes the pid of its rollout's env server process, then sleeps past any timeout."""

    pids: list[int] = []

    async def __call__(self, run: Run) -> None:
        self.pids.append(int(read_state(substrate_dir(run.rollout_id))["pid"]))
        await asyncio.sleep(30)


async def test_rollout_timeout_marks_the_run_and_tears_down(letters_path: Path) -> None:
    """At ``rollout_timeout`` the run is marked ``timeout`` in the agent loop and its substrate
    (an env server process, with its state directory) is gone."""
    ts = letters().filter(ids=["count_letter"])
    agent = SubstrateNotingSleeper()
    job = await run_direct(ts, agent, SubprocessRuntime(letters_path), rollout_timeout=1.5)
    assert len(job.runs) == 2 and len(agent.pids) == 2
    for run in job.runs:
        assert run.status == "timeout" and run.error_phase == "agent loop"
        assert "timed out" in run.error
        assert not substrate_dir(run.rollout_id).exists()
    assert not [pid for pid in agent.pids if pid_alive(pid)]


async def test_unknown_task_fails_before_launch_with_its_phase(letters_path: Path) -> None:
    ts = Taskset("bad", [Task(env="letters", id="no_such_task")])
    job = await run_direct(ts, FixedAgent(answer="3"), LocalRuntime(letters_path))
    run = job.runs[0]
    assert run.status == "failed" and run.error_phase == "starting task"
    assert "no_such_task" in run.error and job.reward is None and job.errors == [run]


async def test_task_raising_at_grade_gives_an_error_grade_not_a_crash(echo_path: Path) -> None:
    ts = Taskset("boom", [Task(env="echo", id="explode", source=str(echo_path))])
    job = await run_direct(ts, FixedAgent(answer="x"), LocalRuntime(echo_path))
    run = job.runs[0]
    assert run.grade is not None and run.grade.is_error and "explode at grade" in run.grade.content
    assert run.status == "errored" and job.errors == [run]


async def test_open_job_accumulates_batches_like_a_training_loop(letters_path: Path) -> None:
    ts = letters().filter(ids=["count_letter"])
    session = await Job.start("grpo", group=2)
    runtime = LocalRuntime(letters_path)
    for _ in range(2):
        start = len(session.runs)
        await run_direct(ts, FixedAgent(answer="3"), runtime, group=2, job=session)
        assert len(session.runs[start:]) == 4
    assert len(session.runs) == 8 and len({r.rollout_id for r in session.runs}) == 8
    assert {r.job_id for r in session.runs} == {session.id}


async def test_an_open_jobs_group_is_the_default_of_its_batches(letters_path: Path) -> None:
    """``Job.start(group=3)`` sets the group of every appended batch; a call's own group wins."""
    ts = letters().filter(ids=["count_letter"])
    session = await Job.start("grpo", group=3)
    runtime = LocalRuntime(letters_path)
    await run_direct(ts, FixedAgent(answer="3"), runtime, job=session)
    assert len(session.runs) == 3 * len(ts) and len({r.group_id for r in session.runs}) == len(ts)
    await run_direct(ts, FixedAgent(answer="3"), runtime, group=1, job=session)
    assert len(session.runs) == 4 * len(ts)
    alone = await run_direct(ts, FixedAgent(answer="3"), runtime)
    assert len(alone.runs) == len(ts)  # no job: one rollout per row


async def test_a_shared_local_server_takes_a_wide_batch_without_refusals(letters_path: Path) -> None:
    """200 rollouts in flight on one LocalRuntime env server: none is refused as busy."""
    ts = Taskset("wide", [Task(env="letters", id="count_letter", args={"word": f"w{i}r", "letter": "r"},
                               source=str(letters_path)) for i in range(200)])
    job = await run_direct(ts, SleepAgent(seconds=1.0, answer="1"), LocalRuntime(letters_path),
                           max_concurrent=200)
    assert [r.status for r in job.runs] == ["succeeded"] * 200, {r.error for r in job.runs}
    assert [r.reward for r in job.runs] == [1.0] * 200


async def test_max_concurrent_caps_live_rollouts(letters_path: Path) -> None:
    live = 0
    peak = 0

    class Counting(Agent):
        async def __call__(self, run: Run) -> None:
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.05)
            live -= 1
            run.trace.content = "3"

    ts = letters().filter(ids=["count_letter"])
    job = await run_direct(ts, Counting(), LocalRuntime(letters_path), group=5, max_concurrent=3)
    assert peak <= 3 and len(job.runs) == 10 and job.reward == 1.0


async def test_a_rollout_timeout_while_the_env_boots_kills_the_half_started_server(tmp_path: Path) -> None:
    env_file = tmp_path / "slow_boot.py"
    env_file.write_text("import time\ntime.sleep(30)\n")
    ts = Taskset("slow", [Task(env="slow", id="t", source=str(env_file))])
    job = await run_direct(ts, FixedAgent(answer="x"), SubprocessRuntime(env_file), rollout_timeout=1.0)
    run = job.runs[0]
    assert run.status == "timeout" and run.error_phase == "provisioning"
    still = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, str(env_file))]
    assert still == []


def _cmdline_has(proc: Path, needle: str) -> bool:
    try:
        return needle.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
