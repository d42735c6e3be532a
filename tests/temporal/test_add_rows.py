"""One job for a whole run: further rows feed the running job's own stream (issue #39 item 2).

``Taskset.start(agent, job=live)`` and ``live.add(taskset)`` chain the added rows after the job's
own (in storage: the workflow input names a chain of row manifests), run them with the job's
agent, runtime and group, and its one stream delivers them after the groups it had, once each,
to the same consumer cursor. An add that reaches a job lingering for a lagging consumer starts
it again. Bad input is one clear error that changes nothing. Adds survive SIGKILLed workers.
Real dev server, real env servers, real worker processes.
"""

from __future__ import annotations

import asyncio

import pytest
from stream_probe import assert_handed_as_replayed, replay_positions
from temporal_helpers import ENV_FILE, CountingAgent, WorkerProcess, read_lines

from durable_rollouts import session
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import get_job
from durable_rollouts.temporal.jobs import describe
from durable_rollouts.temporal.live import JobClosedError
from durable_rollouts.workflows import workflow_id


def _taskset(n: int, tag: str = "row") -> Taskset:
    return Taskset("added", [Task(env="counting", id="echo", source=ENV_FILE,
                                  args={"expected": "x", "tag": f"{tag}{i}"}) for i in range(n)])


async def test_a_further_start_feeds_the_same_jobs_stream(client, task_queue, tmp_path) -> None:
    """Rows added while the job runs start after its own and reach the same consumer, each
    group once; the job's view and its result list every rollout; no second batch is started."""
    log = tmp_path / "agents.log"
    agent = CountingAgent(answer="x", log=str(log))
    async with session():
        job = await _taskset(2).start(agent, runtime=LocalRuntime(ENV_FILE), group=2, epochs=2,
                                      temporal=client, worker=True, task_queue=task_queue,
                                      consumers=["trainer"], linger_s=60, max_in_flight=2)
        groups, added = [], []
        async for batch in job.stream(consumer="trainer", batch_size=1):
            groups.extend(batch.groups)
            if len(groups) == 1:  # mid-run: the same taskset again, and another one
                same = await _taskset(2).start(agent, job=job, temporal=client, worker=True,
                                               task_queue=task_queue)
                added.append(await job.add(_taskset(3, "more"), agent, group=2))
                assert same is job
            await batch.ack()
        done = await job.wait()
    assert len(groups) == 4 + 2 + 3 and all(len(g) == 2 for g in groups)
    assert len({g[0].group_id for g in groups}) == 9  # an added row is a new group, even the same row
    task_of = {r.group_id: r.task for r in done.runs}  # streamed runs carry ids, the job's runs rows
    tags = [task_of[g[0].group_id].args["tag"] for g in groups]
    assert sorted(tags[4:]) == ["more0", "more1", "more2", "row0", "row1"]  # after the job's own
    assert added[0].first == 6 and added[0].rollouts == 6 and added[0].total_rows == 9
    rollouts = sorted(r.rollout_id for g in groups for r in g)
    assert len(set(rollouts)) == 18 and sorted(r.rollout_id for r in done.runs) == rollouts
    assert sorted(line.split()[1] for line in read_lines(log)) == rollouts  # each ran once
    assert {r.status for r in done.runs} == {"succeeded"}
    assert any(r.task.slug.endswith("-a1") for r in done.runs)  # the first add's rows
    view = await get_job(job.id, temporal=client)  # what `rollouts show` reads
    assert sorted(r.rollout_id for r in view.runs) == rollouts
    assert await describe(client, workflow_id(job.id, 1)) is None  # one batch, one stream


async def test_rows_added_to_a_lingering_job_start_it_again(client, task_queue) -> None:
    """The job's rows are done and it lingers for a consumer that lags: an add runs the new rows
    (the trainer's next stream gets them), and the job closes once both caught up."""
    async with session():
        job = await _taskset(2).start(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                      temporal=client, worker=True, task_queue=task_queue,
                                      consumers=["trainer", "eval"], linger_s=60)
        first = [g async for b in job.stream(consumer="trainer") for g in b.groups if await b.ack() >= 0]
        added = await job.add(_taskset(3, "late"))
        second = [g async for b in job.stream(consumer="trainer") for g in b.groups if await b.ack() >= 0]
        late = [g async for b in job.stream(consumer="eval", batch_size=5) for g in b.groups
                if await b.ack() >= 0]
        done = await job.wait()
    task_of = {r.group_id: r.task for r in done.runs}
    assert sorted(task_of[g[0].group_id].args["tag"] for g in first) == ["row0", "row1"]
    assert added.first == 2 and added.rollouts == 3
    assert sorted(task_of[g[0].group_id].args["tag"] for g in second) == ["late0", "late1", "late2"]
    assert len(late) == 5 and len(done.runs) == 5 and {r.status for r in done.runs} == {"succeeded"}


async def test_bad_adds_are_one_clear_error_and_change_nothing(client, task_queue) -> None:
    async with session():
        job = await _taskset(2).start(FixedAgent(answer="x"), runtime=LocalRuntime(ENV_FILE), group=2,
                                      temporal=client, worker=True, task_queue=task_queue,
                                      consumers=["trainer"], linger_s=60)
        bad = [
            (lambda: job.add(_taskset(1), group=3), "group=3: job .* runs every row 2 times"),
            (lambda: job.add(_taskset(1), FixedAgent(answer="y")), "the agent differs"),
            (lambda: job.add(_taskset(1), epochs=None), "epochs=None"),
            (lambda: job.add(_taskset(1), epochs=-1), "epochs=-1"),
            (lambda: job.add(Taskset("empty", [])), "has no rows"),
            (lambda: _taskset(1).start(FixedAgent(answer="x"), job=job, max_in_flight=4),
             "max_in_flight: set when job"),
        ]
        for call, message in bad:
            with pytest.raises(ConfigError, match=message) as err:
                await call()
            assert "\n" not in str(err.value)
        groups = [g async for b in job.stream(consumer="trainer") for g in b.groups if await b.ack() >= 0]
        done = await job.wait()
        with pytest.raises((JobClosedError, ConfigError)):
            await job.add(_taskset(1))  # the job has finished: nothing is added
    assert len(groups) == 2 and len(done.runs) == 4  # the refused adds ran nothing


@pytest.mark.slow  # SIGKILLs the worker twice around adds (~30-60 s)
@pytest.mark.timeout(300)
async def test_adds_survive_worker_kills_each_group_once_no_rollout_run_twice(
        client, dev_server, task_queue, tmp_path, monkeypatch) -> None:
    """A worker SIGKILLed right after an add returned, and one killed while an add is in
    flight: every added row runs, the consumer gets every group once, no rollout ran twice
    except ones in flight on a killed worker (the agent logs its pid with every run), and every
    run of the batch's history replays, delivering each group where the consumer was handed it."""
    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")  # a killed worker's substrates: gone soon
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # and its agent steps noticed soon
    agents = tmp_path / "agents.log"
    workers = [WorkerProcess(dev_server.address, task_queue)]
    killed: list[int] = []

    def kill_worker() -> None:
        killed.append(workers[-1].pid)
        workers[-1].kill()
        workers.append(WorkerProcess(dev_server.address, task_queue))

    try:
        job = await _taskset(8).start(CountingAgent(answer="x", seconds=0.3, log=str(agents)),
                                      runtime=LocalRuntime(ENV_FILE), group=2, max_concurrent=6,
                                      temporal=client, worker=False, task_queue=task_queue,
                                      consumers=["trainer"], linger_s=120)
        groups: list[str] = []
        handed: set[tuple[int, str]] = set()
        adds: list[asyncio.Future] = []
        async for batch in job.stream(consumer="trainer", batch_size=1):
            groups.extend(g[0].group_id for g in batch.groups)
            handed |= {(r.seq, r.group_id) for r in batch.records}
            if len(groups) == 2:
                await job.add(_taskset(6, "one"))
                kill_worker()  # the add returned: it is in history, whoever runs the batch
            if len(groups) == 6:
                adds.append(asyncio.ensure_future(job.add(_taskset(6, "two"))))
                await asyncio.sleep(0.05)
                kill_worker()  # the add's update or its activity may be in flight
            await batch.ack()
        added = await asyncio.wait_for(adds[0], 60)
        done = await asyncio.wait_for(job.wait(), 120)
        replay = await replay_positions(client, workflow_id(job.id), group=2)
    finally:
        for worker in workers:
            worker.stop()
    assert added.first == 14 and len(killed) == 2
    assert len(groups) == len(set(groups)) == 8 + 6 + 6  # every group once, the added ones too
    final = sorted(r.rollout_id for r in done.runs)
    assert len(final) == len(set(final)) == 40 and {r.status for r in done.runs} == {"succeeded"}
    runs = [line.split() for line in read_lines(agents)]
    assert sorted({rid for _, rid in runs}) == final
    for rid in {r for _, r in runs}:
        pids = [int(pid) for pid, r in runs if r == rid]
        assert all(pid in killed for pid in pids[:-1]), (rid, pids, killed)
    assert replay.runs >= 2  # a run that took adds continues as new (its input names them)
    assert_handed_as_replayed(handed, replay)  # the order a replay rebuilds after a kill
