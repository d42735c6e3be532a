"""One plan, two executors: ``run_direct`` and ``Taskset.run`` walk the same steps for the same task.

The same two tasks (one graded by a verifier), in groups of 2, go through the direct executor and
the durable one. A recording agent notes what its ``Run`` says about itself. Both must record the
card's steps in the same order (the durable path's from Temporal's own history, the direct path's
from ``trace.extra["walked"]``), hand the agent the same ``group_index``/``row_index``/``attempt``
and rollout ids of the same shape, and reach the same rewards. Real dev server, real env
subprocesses.
"""

from __future__ import annotations

from pathlib import Path

from history_scan import step_names

from durable_rollouts.models import Task
from durable_rollouts.runtimes import SubprocessRuntime
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset

SPELLING = Path(__file__).resolve().parents[2] / "examples/verifier/spelling.py"
PLAIN = ["provision", "connect", "start", "agent", "grade", "teardown"]
VERIFIED = ["provision", "connect", "start", "agent", "grade", "verify_open", "verify",
            "verify_close", "teardown"]


class Recorder(Agent):
    """Spells the word backwards and notes the run's own view of itself."""

    seen: list[tuple[str, int, int, int, str]] = []

    async def __call__(self, run: Run) -> None:
        assert run.task is not None
        word = run.task.args["word"]
        Recorder.seen.append((word, run.group_index, run.row_index, run.attempt,
                              run.rollout_id.removeprefix(f"job-{run.job_id}-")))
        run.trace.content = word[::-1] if word != "stressed" else "stressed"  # the 2nd row: wrong


def _taskset() -> Taskset:
    plain = Task(env="spelling", id="spell_backwards", args={"word": "drawer"}, source=str(SPELLING))
    verifier = Task(env="spelling", id="check_reversed", args={"word": "stressed"}, source=str(SPELLING))
    verified = Task(env="spelling", id="spell_backwards", args={"word": "stressed"},
                    source=str(SPELLING), verifier=verifier)
    return Taskset("parity", [plain, verified])


def _fields(job) -> list[tuple]:
    return sorted((run.row_index, run.group_index, run.attempt, run.reward,
                   run.rollout_id.removeprefix(f"job-{job.id}-"), run.group_id.removeprefix(job.id))
                  for run in job.runs)


async def test_direct_and_durable_walk_the_same_plan_with_the_same_runs(client, task_queue) -> None:
    Recorder.seen = []
    direct = await run_direct(_taskset(), Recorder(), SubprocessRuntime(), group=2)
    direct_seen, Recorder.seen = sorted(Recorder.seen), []
    durable = await run_taskset(_taskset(), Recorder(), runtime=SubprocessRuntime(), group=2,
                                temporal=client, worker=True, task_queue=task_queue)
    durable_seen = sorted(Recorder.seen)

    assert [r.status for r in direct.runs] == ["succeeded"] * 4, [r.error for r in direct.runs]
    assert [r.status for r in durable.runs] == ["succeeded"] * 4, [r.error for r in durable.runs]
    # the same steps in the same order, per rollout
    for run in direct.runs:
        assert run.trace.extra["walked"] == (VERIFIED if run.row_index == 1 else PLAIN)
    for run in durable.runs:
        history = await client.get_workflow_handle(run.rollout_id).fetch_history()
        assert step_names(history) == (VERIFIED if run.row_index == 1 else PLAIN)
    # what the agent saw, and what came back: ids, group/row indexes, attempts, rewards
    assert direct_seen == durable_seen
    assert {s[1] for s in direct_seen} == {0, 1} and {s[2] for s in direct_seen} == {0, 1}
    assert _fields(direct) == _fields(durable)
    assert sorted(r.reward for r in direct.runs) == [0.0, 0.0, 1.0, 1.0]  # the verifier decides


async def test_a_group_of_3_over_2_rows_sees_the_same_indexes_in_both_executors(client, task_queue) -> None:
    """The agent's ``(row_index, group_index, attempt)`` set is the same set of 6 in both."""
    rows = [Task(env="spelling", id="spell_backwards", args={"word": w}, source=str(SPELLING))
            for w in ("drawer", "stressed")]
    Recorder.seen = []
    await run_direct(Taskset("g3", rows), Recorder(), SubprocessRuntime(), group=3)
    direct_seen, Recorder.seen = {(s[2], s[1], s[3]) for s in Recorder.seen}, []
    await run_taskset(Taskset("g3", rows), Recorder(), runtime=SubprocessRuntime(), group=3,
                      temporal=client, worker=True, task_queue=task_queue)
    durable_seen = {(s[2], s[1], s[3]) for s in Recorder.seen}
    assert direct_seen == durable_seen == {(r, g, 1) for r in (0, 1) for g in (0, 1, 2)}
