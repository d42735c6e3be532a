"""A batch wider than one workflow may hold (issue #42 item 2), on a dev server whose
per-workflow pending-children limit is lowered to 20 (dynamic config), so the test stays small.

``max_concurrent=50`` with ``ROLLOUTS_CHILDREN_PER_WORKFLOW=15``: the batch runs as 4 parts (child
TasksetRuns of at most 13 rollouts in flight each) and still looks like one job: one job id, one
progress (more than 20 rollouts running at once), one ``rollouts show`` / ``export``, every rollout
run once. ``rollouts cancel`` mid-way stops every part; ``rollouts resume`` runs the rest, again
as parts. A streamed batch that wide runs as parts too, feeding its one stream (``max_in_flight``
and the policy hold across them); an open-ended one is refused with one clear error naming the knob.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter

import pytest
from temporal_helpers import ENV_FILE, HERE, CountingAgent, DevServer, configured_server, read_lines
from temporalio.common import SearchAttributeKey
from temporalio.worker import Replayer

from durable_rollouts import session
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.connection import connect_client
from durable_rollouts.temporal.jobs import describe
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id

sys.path.insert(0, str(HERE.parents[0] / "cli"))
from cli_helpers import rollouts

LIMIT = 20  # limit.numPendingChildExecutions.error on this test's server
PER_WORKFLOW = "15"
ROWS, GROUP, WIDTH = 30, 2, 50  # 60 rollouts, 50 at a time: 4 parts of 15 slots, 13 in flight each


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory):
    with configured_server(tmp_path_factory.mktemp("limited"),
                           {"limit.numPendingChildExecutions.error": LIMIT}) as server:
        yield server


@pytest.fixture
def per_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_CHILDREN_PER_WORKFLOW", PER_WORKFLOW)


def _taskset(name: str) -> Taskset:
    return Taskset(name, [Task(env="counting", id="echo", source=ENV_FILE,
                               args={"expected": "x", "tag": f"row{i}"}) for i in range(ROWS)])


def _cli(server: DevServer, *args: str, timeout: float = 120):
    """``rollouts ARGS`` against the limited server, in a thread (this loop's worker keeps working)."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return asyncio.to_thread(rollouts, *args, "--temporal", server.address, timeout=timeout,
                             ROLLOUTS_CHILDREN_PER_WORKFLOW=PER_WORKFLOW, PYTHONPATH=path)


async def _peak_running(handle, until: asyncio.Future) -> int:
    peak = 0
    while not until.done():
        with contextlib.suppress(Exception):  # no worker answered yet
            peak = max(peak, (await handle.progress()).running)
        await asyncio.sleep(0.2)
    return peak


async def test_a_batch_wider_than_one_workflow_runs_as_parts_and_is_one_job(
        limited_server, per_workflow, tmp_path) -> None:
    client = await connect_client(limited_server.address)
    log = tmp_path / "agents.log"
    queue = f"fan-{os.getpid()}-{time.monotonic_ns()}"
    handle = await _taskset("wide").run(
        CountingAgent(answer="x", log=str(log), seconds=3.0), runtime=LocalRuntime(ENV_FILE),
        group=GROUP, max_concurrent=WIDTH, temporal=client, worker=True, task_queue=queue, wait=False)
    done = asyncio.ensure_future(handle.wait())
    peak = await _peak_running(handle, done)
    job = await done

    assert len(job.runs) == ROWS * GROUP and {r.status for r in job.runs} == {"succeeded"}
    started = Counter(line.split()[1] for line in read_lines(log))
    assert sorted(started) == sorted(r.rollout_id for r in job.runs)
    assert set(started.values()) == {1}  # every rollout ran exactly once
    assert peak > LIMIT, peak  # more in flight than one workflow may hold, in one progress
    parts = [await describe(client, f"{workflow_id(job.id)}/part-{k}") for k in range(5)]
    assert [p is not None for p in parts] == [True] * 4 + [False]
    key = SearchAttributeKey.for_keyword("RolloutsJobId")  # the Web UI lists the parts with the job
    assert {p.typed_search_attributes.get(key) for p in parts[:4]} == {job.id}

    shown = (await _cli(limited_server, "show", job.id, "--json")).json()
    assert [b["workflow_id"] for b in shown["batches"]] == [workflow_id(job.id)]
    assert shown["status"] == "completed" and shown["counts"] == {"succeeded": ROWS * GROUP}
    assert sorted(r["rollout_id"] for r in shown["rollouts"]) == sorted(started)
    listed = (await _cli(limited_server, "jobs", "--json")).json()
    assert [j["job_id"] for j in listed if job.id in j["job_id"]] == [job.id]  # no part listed as a job
    out = tmp_path / "export.jsonl"
    exported = await _cli(limited_server, "export", job.id, "-o", str(out))
    assert exported.code == 0, exported.err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["rollout_id"] for r in lines) == sorted(started)
    assert {r["job_id"] for r in lines} == {job.id} and {r["reward"] for r in lines} == {1.0}


async def test_cancel_stops_every_part_and_resume_runs_the_rest_as_parts(
        limited_server, per_workflow, tmp_path) -> None:
    client = await connect_client(limited_server.address)
    log, fast = tmp_path / "agents.log", tmp_path / "fast"
    queue = f"fan-{os.getpid()}-{time.monotonic_ns()}"
    handle = await _taskset("cut").run(
        CountingAgent(answer="x", log=str(log), seconds=60.0, fast_file=str(fast)),
        runtime=LocalRuntime(ENV_FILE), group=GROUP, max_concurrent=WIDTH, temporal=client,
        worker=True, task_queue=queue, wait=False)
    job_id = handle.job.id
    deadline = time.monotonic() + 60
    while len(read_lines(log)) < 40 and time.monotonic() < deadline:  # past one workflow's limit
        await asyncio.sleep(0.2)
    assert len(read_lines(log)) >= 40
    assert (await handle.progress()).running > LIMIT

    cancelled = await _cli(limited_server, "cancel", job_id)
    assert cancelled.code == 0 and f"cancelled job {job_id}" in cancelled.out, cancelled.err
    await handle.release()
    shown = (await _cli(limited_server, "show", job_id, "--json")).json()
    assert shown["status"] == "cancelled" and len(shown["batches"]) == 1
    assert shown["counts"] == {"cancelled": ROWS * GROUP}
    first = Counter(line.split()[1] for line in read_lines(log))
    assert set(first.values()) == {1} and 40 <= len(first) < ROWS * GROUP

    fast.touch()
    log.write_text("")
    resumed = await _cli(limited_server, "resume", job_id, "--only", "cancelled", "--worker", "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["counts"] == {"succeeded": ROWS * GROUP}
    assert resumed.json()["status"] == "completed"
    again = Counter(line.split()[1] for line in read_lines(log))
    assert sorted(again) == sorted(r["rollout_id"] for r in shown["rollouts"])
    assert set(again.values()) == {1}  # each rollout once more, none twice
    part = await describe(client, f"{workflow_id(job_id)}/part-0")
    assert part is not None and part.start_time > (await describe(client, workflow_id(job_id))).start_time


async def _start_streamed(client, name: str, log, seconds: float, **options):  # type: ignore[no-untyped-def]
    """A streamed batch of ``_taskset(name)``, ``WIDTH`` wide, consumer ``trainer`` registered."""
    return await _taskset(name).start(
        CountingAgent(answer="x", log=str(log), seconds=seconds), runtime=LocalRuntime(ENV_FILE),
        group=GROUP, max_concurrent=WIDTH, temporal=client, worker=True, consumers=["trainer"],
        task_queue=f"fan-{os.getpid()}-{time.monotonic_ns()}", linger_s=60, **options)


async def _consume(job, seen: list, *, batch_size: int, every_group: object = None) -> None:
    """Read the job's stream as consumer ``trainer`` to its end, acking each batch; calls
    ``every_group(count)`` after each batch."""
    async for batch in job.stream(consumer="trainer", batch_size=batch_size):
        seen.extend(batch.groups)
        await batch.ack()
        if every_group is not None:
            await every_group(len(seen))


async def test_a_streamed_batch_wider_than_one_workflow_feeds_one_stream(
        limited_server, per_workflow, tmp_path) -> None:
    """60 rollouts 50 at a time (above the server's 20): the parts run them, every finished
    group reaches the batch's one stream, and the consumer applies each group once."""
    client = await connect_client(limited_server.address)
    log = tmp_path / "agents.log"
    async with session():
        job = await _start_streamed(client, "wide-stream", log, 3.0, page_size=2)  # pages written as parts end
        groups: list = []
        consumed = asyncio.ensure_future(_consume(job, groups, batch_size=4))
        peak = await _peak_running(job.handle, consumed)
        await consumed
        done = await job.wait()

    assert peak > LIMIT, peak  # more in flight than one workflow may hold
    assert len(groups) == ROWS and all(len(g) == GROUP for g in groups)
    assert len({g[0].group_id for g in groups}) == ROWS  # every group once, whichever part ran it
    assert all(len({r.group_id for r in g}) == 1 for g in groups)
    started = Counter(line.split()[1] for line in read_lines(log))
    assert set(started.values()) == {1} and len(started) == ROWS * GROUP
    assert sorted(started) == sorted(r.rollout_id for g in groups for r in g)
    assert sorted(started) == sorted(r.rollout_id for r in done.runs)
    parts = [await describe(client, f"{workflow_id(job.id)}/part-{k}") for k in range(5)]
    assert [p is not None for p in parts] == [True] * 4 + [False]
    shown = (await _cli(limited_server, "show", job.id, "--json")).json()
    assert [b["workflow_id"] for b in shown["batches"]] == [workflow_id(job.id)]
    assert shown["status"] == "completed" and shown["counts"] == {"succeeded": ROWS * GROUP}


async def test_max_in_flight_and_the_policy_hold_across_parts_and_continue_as_new(
        limited_server, per_workflow, tmp_path) -> None:
    """``max_in_flight=12`` groups of 2 (24 rollouts, above the server's 20: parts) with a slow
    consumer: the batch grants the parts groups as the consumer acks, so no more than 12 groups
    are ever running or unacknowledged; the policy the trainer publishes reaches the parts; a
    short history makes the batch continue as new while its parts run, and nothing is lost."""
    client = await connect_client(limited_server.address)
    log = tmp_path / "agents.log"
    flight = 12
    async with session():
        job = await _start_streamed(client, "paced-stream", log, 1.0, max_in_flight=flight,
                                    max_history_events=120)
        groups: list = []
        worst: list[int] = []

        async def after(count: int) -> None:
            begun = len(read_lines(log))  # rollouts started so far
            worst.append(-(-begun // GROUP) - count)  # groups begun and not yet acknowledged
            if count == 6:
                await job.set_policy(1)
            await asyncio.sleep(0.3)  # a slow trainer: the parts wait for its acks

        await _consume(job, groups, batch_size=2, every_group=after)
        done = await job.wait()
        latest = await client.get_workflow_handle(workflow_id(job.id)).describe()
        runs = latest.raw_description.workflow_execution_info

    assert len(groups) == ROWS and len({g[0].group_id for g in groups}) == ROWS
    started = Counter(line.split()[1] for line in read_lines(log))
    assert set(started.values()) == {1} and len(started) == ROWS * GROUP
    assert max(worst) <= flight, worst  # never more than max_in_flight groups out at once
    versions = [r.policy_version for g in groups for r in g]
    assert versions[:4] == [None] * 4 and versions[-2:] == [1, 1], versions
    assert sorted(started) == sorted(r.rollout_id for r in done.runs)
    first = runs.first_run_id
    assert first and first != runs.execution.run_id  # the batch continued as new meanwhile
    # Every run of the batch and of its parts replays on this release's code (deterministic).
    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    batch = workflow_id(job.id)
    histories = []
    for wid in [batch, *(f"{batch}/part-{k}" for k in range(4))]:
        async for execution in client.list_workflows(f'WorkflowId="{wid}"'):
            histories.append(await client.get_workflow_handle(wid, run_id=execution.run_id).fetch_history())
    assert len(histories) > 5  # the batch's runs (more than one) and the 4 parts'
    for history in histories:
        await replayer.replay_workflow(history)


async def test_stale_groups_from_the_parts_are_sampled_again_by_the_batch(
        limited_server, per_workflow, tmp_path) -> None:
    """``max_staleness=0``: the trainer moves to policy 1 after 3 groups; groups the parts finish
    with version-0 members are stale and sampled again, by the batch once its parts are done.
    Every row is delivered once, and every re-sampled rollout ran once more."""
    client = await connect_client(limited_server.address)
    log = tmp_path / "agents.log"
    async with session():
        job = await _start_streamed(client, "stale-wide", log, 1.0, policy_version=0, max_staleness=0)
        records: list = []
        async for batch in job.stream(consumer="trainer", batch_size=1):
            records.extend(batch.records)
            await batch.ack()
            if len(records) == 3:
                await job.set_policy(1)
        await job.wait()

    assert sorted(r.row_index for r in records) == list(range(ROWS))  # every row once
    assert len({r.group_id for r in records}) == ROWS
    again = [r for r in records if r.policy_version == 1]
    assert again and all(len(r.results) == GROUP for r in records)
    started = Counter(line.split()[1] for line in read_lines(log))
    assert set(started.values()) == {1}  # a re-sampled rollout is a new rollout (its own id)
    resampled = len(started) - ROWS * GROUP
    assert resampled > 0 and resampled % GROUP == 0, resampled


async def test_an_open_ended_streamed_batch_that_wide_is_refused(limited_server, per_workflow) -> None:
    client = await connect_client(limited_server.address)
    with pytest.raises(ConfigError, match="ROLLOUTS_CHILDREN_PER_WORKFLOW") as err:
        await _taskset("open").start(
            CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=GROUP, epochs=None,
            max_concurrent=WIDTH, temporal=client, worker=True, consumers=["trainer"])
    assert "epochs=None" in str(err.value) and "wider than 15" in str(err.value)
    with pytest.raises(ConfigError, match="group=16 is more than one part holds"):
        await _taskset("big").start(
            CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=16,
            max_concurrent=WIDTH, temporal=client, worker=True, consumers=["trainer"])


async def test_without_parts_the_lowered_limit_holds_a_batch_at_it(
        limited_server, monkeypatch, tmp_path) -> None:
    """The control: as one workflow (knob above the width) the same batch starts nothing: the
    server refuses the workflow task that starts 50 children (PendingChildWorkflowsLimitExceeded),
    so the parts above are what carried the batch past the limit."""
    monkeypatch.setenv("ROLLOUTS_CHILDREN_PER_WORKFLOW", "100")
    client = await connect_client(limited_server.address)
    log, fast = tmp_path / "agents.log", tmp_path / "fast"
    handle = await _taskset("capped").run(
        CountingAgent(answer="x", log=str(log), seconds=60.0, fast_file=str(fast)),
        runtime=LocalRuntime(ENV_FILE), group=GROUP, max_concurrent=WIDTH, temporal=client,
        worker=True, task_queue=f"fan-{os.getpid()}-{time.monotonic_ns()}", wait=False)
    await asyncio.sleep(8)  # the server refuses the task that starts 50 children, again and again
    assert read_lines(log) == []
    assert (await handle.handle.describe()).raw_description.pending_children == []
    fast.touch()
    await handle.handle.terminate("test over")
    await handle.release()


async def test_a_wide_batch_starts_its_children_a_bounded_number_per_workflow_task(
        client, task_queue) -> None:
    """150 rollouts at once (one workflow): the batch starts 100 children, yields to a 1 ms
    timer, then starts the rest; every rollout still runs once."""
    taskset = Taskset("paced", [Task(env="counting", id="echo", source=ENV_FILE,
                                     args={"expected": "x", "tag": f"row{i}"}) for i in range(150)])
    job = await taskset.run(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                            max_concurrent=150, temporal=client, worker=True, task_queue=task_queue)
    assert len(job.runs) == 150 and {r.status for r in job.runs} == {"succeeded"}
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    kinds = [e.WhichOneof("attributes") for e in history.events]
    per_task, starts = [], 0  # child starts each workflow task's commands made
    for kind in kinds:
        if kind == "start_child_workflow_execution_initiated_event_attributes":
            starts += 1
        elif kind == "workflow_task_completed_event_attributes":
            per_task, starts = [*per_task, starts], 0
    assert max(per_task) == 100 and sum(per_task) + starts == 150, per_task
    assert "timer_started_event_attributes" in kinds
    assert b"paced-child-starts" in b"".join(e.SerializeToString() for e in history.events)


async def test_on_error_fail_in_one_part_stops_every_part(limited_server, per_workflow, tmp_path) -> None:
    """on_error="fail": a rollout of part 0 errors; its part cancels its rest and the batch tells
    the other parts (signal ``stop_batch``), whose 60 s agents are cancelled at once, not waited for."""
    client = await connect_client(limited_server.address)
    log = tmp_path / "agents.log"
    began = time.monotonic()
    job = await _taskset("stop").run(
        CountingAgent(answer="x", log=str(log), seconds=60.0, raise_for="row3"),
        runtime=LocalRuntime(ENV_FILE), group=GROUP, max_concurrent=WIDTH, temporal=client,
        worker=True, task_queue=f"fan-{os.getpid()}-{time.monotonic_ns()}", on_error="fail",
        max_attempts=1)
    assert time.monotonic() - began < 45
    counts = Counter(r.status for r in job.runs)
    # row3's members both raise; the first error may cancel its sibling before that one's own
    # error is recorded, so one or both count as errored and every other rollout is cancelled
    assert 1 <= counts["errored"] <= GROUP, counts
    assert counts["cancelled"] == ROWS * GROUP - counts["errored"], counts
    assert len(job.runs) == ROWS * GROUP
    assert {r.row_index for r in job.runs if r.status == "errored"} == {3}
