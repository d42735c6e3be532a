"""Every Rollout records the card's steps, for every runtime: read from Temporal's own history.

provision -> connect -> start -> agent -> grade -> [verify_open -> verify -> verify_close] ->
teardown, each a separately named activity; the cheap ones as local activities (markers with
their activity type) when the substrate is reachable from the workflow's worker, the agent step
always a scheduled activity with a heartbeat timeout. Real dev server, real env servers.
"""

from __future__ import annotations

from pathlib import Path

from history_scan import step_events, step_names
from temporal_helpers import ENV_FILE, read_lines

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime
from durable_rollouts.sdk.agents import Agent, FixedAgent
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset
from durable_rollouts.settings import AGENT_HEARTBEAT_WATCHED_S

CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]
REPO = Path(__file__).resolve().parents[2]


def _echo(expected: str, grade_log: Path | None = None, **extra: object) -> Task:
    args = {"expected": expected, **({"grade_log": str(grade_log)} if grade_log else {}), **extra}
    return Task(env="counting", id="echo", args=args, source=ENV_FILE)


async def _histories(client, job) -> list:
    """The histories of the job's Rollouts (by their workflow ids, in the job's order)."""
    return [await client.get_workflow_handle(run.rollout_id + (f"-r{run.retries}" if run.retries else ""))
            .fetch_history() for run in job.runs]


def _agent_heartbeat(history) -> float:
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "rollouts.agent":
                return attrs.heartbeat_timeout.ToTimedelta().total_seconds()
    raise AssertionError("no agent step in the history")


async def test_an_in_process_rollout_records_the_card_steps(client, task_queue, evidence) -> None:
    grades = evidence / "grades.log"
    job = await run_taskset(Taskset("card", [_echo("a", grades), _echo("b", grades)]),
                            FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), temporal=client,
                            worker=True, task_queue=task_queue)
    assert [r.reward for r in job.runs] == [1.0, 0.0]
    for history in await _histories(client, job):
        assert step_names(history) == CARD
        kinds = dict(step_events(history))
        assert kinds["rollouts.agent"] == "activity"  # never local: it heartbeats
        assert {kinds[f"rollouts.{s}"] for s in CARD if s != "agent"} == {"local"}
        assert _agent_heartbeat(history) == AGENT_HEARTBEAT_WATCHED_S
    assert len(read_lines(grades)) == 2  # one real grade per rollout


async def test_a_subprocess_rollout_records_the_card_steps(client, task_queue, evidence) -> None:
    job = await run_taskset(Taskset("card-sub", [_echo("a")]), FixedAgent(answer="a"),
                            runtime=SubprocessRuntime(ENV_FILE), temporal=client, worker=True,
                            task_queue=task_queue)
    assert job.runs[0].reward == 1.0
    (history,) = await _histories(client, job)
    assert step_names(history) == CARD


async def test_a_verifier_task_records_the_verify_steps_between_grade_and_teardown(
        client, task_queue) -> None:
    spelling, referee = REPO / "examples/verifier/spelling.py", REPO / "examples/verifier/referee.py"
    def row(word: str, verifier_env: str, verifier_id: str, source: Path) -> Task:
        verifier = Task(env=verifier_env, id=verifier_id, args={"word": word}, source=str(source))
        return Task(env="spelling", id="spell_backwards", args={"word": word}, source=str(spelling),
                    verifier=verifier)

    # the same env's verifier (a new session on the actor's server), then a separate env's
    rows = [row("drawer", "spelling", "check_reversed", spelling), row("stressed", "referee", "referee", referee)]
    job = await run_taskset(Taskset("card-verify", rows), FixedAgent(answer="reward"),
                            runtime=SubprocessRuntime(), temporal=client, worker=True,
                            task_queue=task_queue)
    assert [r.reward for r in job.runs] == [1.0, 0.0], [r.error for r in job.runs]
    for history in await _histories(client, job):
        assert step_names(history) == ["provision", "connect", "start", "agent", "grade",
                                       "verify_open", "verify", "verify_close", "teardown"]


class _Identity(Agent):
    """Answers with what the run says about itself: rollout id, group index, row, attempt."""

    async def __call__(self, run: Run) -> None:
        run.trace.content = f"{run.rollout_id}|{run.group_index}|{run.row_index}|{run.attempt}"


async def test_the_agent_sees_its_group_index_row_and_stable_rollout_id(client, task_queue) -> None:
    job = await run_taskset(Taskset("ids", [_echo("x"), _echo("y")]), _Identity(),
                            runtime=LocalRuntime(ENV_FILE), group=2, temporal=client, worker=True,
                            task_queue=task_queue)
    seen = sorted(run.trace.content.split("|")[1:] for run in job.runs)
    assert seen == [["0", "0", "1"], ["0", "1", "1"], ["1", "0", "1"], ["1", "1", "1"]]
    assert all(run.trace.content.split("|")[0] == run.rollout_id for run in job.runs)


class _FailFirst(Agent):
    """Raises on the first run of each rollout (attempt 1), answers ``x`` on a fresh re-run."""

    async def __call__(self, run: Run) -> None:
        if run.attempt == 1:
            raise RuntimeError(f"first run of {run.rollout_id}")
        run.trace.content = f"x|{run.rollout_id}|{run.attempt}"


async def test_a_fresh_retry_keeps_the_rollout_id_and_counts_the_attempt(client, task_queue) -> None:
    job = await run_taskset(Taskset("retry", [_echo("x")]), _FailFirst(), runtime=LocalRuntime(ENV_FILE),
                            retries=1, temporal=client, worker=True, task_queue=task_queue)
    (run,) = job.runs
    assert run.status == "succeeded" and run.retries == 1 and run.attempt == 2
    assert run.trace.content == f"x|{run.rollout_id}|2"  # not ...-r1
    assert not run.rollout_id.endswith("-r1")
    first = await client.get_workflow_handle(run.rollout_id).fetch_history()
    second = await client.get_workflow_handle(f"{run.rollout_id}-r1").fetch_history()
    assert step_names(first) == CARD and step_names(second) == CARD
