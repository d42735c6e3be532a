"""A long stream with a small page size, on a real dev server with real envs and real storage.

Groups every registered consumer acknowledged leave the batch's workflow state in pages
(``ROLLOUTS_STORAGE``); a consumer that registers after most groups were paged reads them from
storage, in order, under the same cursor rules; each consumer applies every group exactly once
(counted from its own log against the agent's log of every rollout run); the state the batch
holds (its ``stream_kept`` query) and what each continue-as-new carries stay under a bound far
below the job's length; every run's history replays. The same holds with a trainer SIGKILLed
between receiving a batch and acknowledging it (three times) and a worker SIGKILLed with rollouts
in flight (twice). After the job closed, a consumer's acknowledgements are stored next to the
pages: reading twice gives each group once in all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for, read_lines
from stream_probe import assert_handed_as_replayed, replay_histories, replay_positions
from temporalio.worker import Replayer

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.settings import settings
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.stream_pages import StreamStore
from durable_rollouts.workflows import Rollout, TasksetRun, workflow_id
from durable_rollouts.workflows.stream_paging import KeptState

HERE = Path(__file__).resolve().parent


def _rows(n: int) -> Taskset:
    return Taskset("paged", [Task(env="counting", id="echo", source=ENV_FILE,
                                  args={"expected": "x", "tag": f"row{i}"}) for i in range(n)])


def _consumer(address: str, job_id: str, name: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parent / "temporal"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "stream_consumer.py"), address, job_id, name,
                             str(log), *extra], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def _applied(log: Path) -> list[dict]:
    return [json.loads(line) for line in read_lines(log)]


def _check_exactly_once(log: Path, groups: int, ran: list[str]) -> None:
    """The consumer's batches are contiguous from 0 to ``groups`` (one cursor, in order), hold
    every group once, and their rollouts are exactly the ones the agent ran."""
    batches = _applied(log)
    spans = [tuple(int(x) for x in b["batch"].split(":")[1].split("-")) for b in batches]
    assert spans[0][0] == 0 and spans[-1][1] == groups, spans
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
    seen = [g for b in batches for g in b["groups"]]
    assert len(seen) == len(set(seen)) == groups
    assert sorted(r for b in batches for r in b["rollouts"]) == sorted(ran)


def _stored_pages(job_id: str) -> list[Path]:
    root = Path(settings().storage.removeprefix("file://")) if settings().storage else \
        Path(os.environ["ROLLOUTS_HOME"]) / "storage"
    return sorted((root / "named" / "streams" / job_id / "b0").glob("page-*.jsonl"))


async def _carries(client, wid: str) -> list[int]:
    """Bytes each continue-as-new carried (the input of every run after the first)."""
    sizes = []
    async for execution in client.list_workflows(f'WorkflowId="{wid}"'):
        history = await client.get_workflow_handle(wid, run_id=execution.run_id).fetch_history()
        first = history.events[0].workflow_execution_started_event_attributes
        if first.continued_execution_run_id:
            sizes.append(sum(p.ByteSize() for p in first.input.payloads))
    return sizes


def _handed(logs: list[Path]) -> set[tuple[int, str]]:
    """Every (position, group) the consumers logged being handed."""
    return {(seq, gid) for log in logs for b in _applied(log) for seq, gid in zip(b["seqs"], b["groups"])}


GROUPS, PAGE, IN_FLIGHT = 80, 4, 6


@pytest.mark.slow  # 160 rollouts, three continue-as-new, two consumer processes (~40 s)
@pytest.mark.timeout(300)
async def test_a_long_stream_keeps_bounded_state_and_a_late_consumer_reads_the_pages(
        client, dev_server, task_queue, tmp_path: Path) -> None:
    agents = tmp_path / "agents.log"
    job = await _rows(GROUPS).start(
        CountingAgent(answer="x", log=str(agents)), runtime=LocalRuntime(ENV_FILE), group=2,
        max_concurrent=8, temporal=client, worker=True, task_queue=task_queue, linger_s=120,
        consumers=["trainer"], max_in_flight=IN_FLIGHT, page_size=PAGE, max_history_events=400)
    wid = workflow_id(job.id)
    kept: list[KeptState] = []
    polling = True

    async def poll() -> None:
        while polling:
            try:
                kept.append(await client.get_workflow_handle(wid).query(TasksetRun.stream_kept))
            except Exception:  # noqa: BLE001 - between two runs (continue-as-new), or closed
                pass
            await asyncio.sleep(0.1)

    poller = asyncio.ensure_future(poll())
    trainer_log, late_log = tmp_path / "trainer.log", tmp_path / "late.log"
    trainer = _consumer(dev_server.address, job.id, "trainer", trainer_log, "--batch-size", "2")
    late = None
    try:
        await async_wait_for(lambda: sum(len(b["groups"]) for b in _applied(trainer_log)) >= GROUPS * 3 // 5,
                             timeout=180, what="the trainer to apply most groups")
        # The poll can lag the trainer on a loaded box (a query fails across continue-as-new and
        # is asked again): start the late consumer once the state shows most groups paged.
        await async_wait_for(lambda: bool(kept) and kept[-1].base >= GROUPS // 2, timeout=120,
                             what="most groups to be paged")
        paged_when_late, late_at = kept[-1].base, len(kept)
        late = _consumer(dev_server.address, job.id, "late", late_log, "--batch-size", "3")
        loop = asyncio.get_running_loop()
        for proc in (trainer, late):
            out, _ = await asyncio.wait_for(loop.run_in_executor(None, proc.communicate, None), 240)
            assert "DONE" in out, out
        done = await asyncio.wait_for(job.wait(), 60)  # both consumers caught up: it closes
    finally:
        polling = False
        for proc in (trainer, late):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        await poller
    ran = [line.split()[1] for line in read_lines(agents)]
    assert len(ran) == len(set(ran)) == 2 * GROUPS and len(done.runs) == 2 * GROUPS  # none ran twice
    _check_exactly_once(trainer_log, GROUPS, ran)
    _check_exactly_once(late_log, GROUPS, ran)
    assert paged_when_late >= GROUPS // 2  # most groups were already out of the state
    pages = _stored_pages(job.id)
    assert len(pages) == GROUPS // PAGE  # written once each (by name), the last at close
    # The bound while the trainer is the only consumer: what runs or waits for its ack
    # (max_in_flight), a page not yet full, and one acknowledged page not yet written.
    assert late_at > 10 and len(kept) > late_at
    assert max(k.kept_groups for k in kept[:late_at]) <= IN_FLIGHT + 2 * PAGE, kept[:late_at]
    # A late consumer holds what it has not acknowledged; it reads the paged groups from
    # storage, so it soon lets the batch page again: never near the job's length.
    assert max(k.kept_groups for k in kept) <= GROUPS // 2, [k.kept_groups for k in kept]
    assert max(k.state_bytes for k in kept) < 64 * 1024
    carries = await _carries(client, wid)
    assert len(carries) >= 2 and max(carries) < 64 * 1024, carries  # it continued as new, small
    replay = await replay_positions(client, wid, group=2)
    assert replay.runs == len(carries) + 1 and len(replay.positions) == GROUPS
    assert_handed_as_replayed(_handed([trainer_log, late_log]), replay)


async def test_a_closed_jobs_acknowledgements_are_stored_and_each_group_comes_once(
        client, task_queue, tmp_path: Path) -> None:
    rows = 10
    job = await _rows(rows).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                  temporal=client, worker=True, task_queue=task_queue, page_size=3)
    async for batch in job.stream(consumer="trainer", batch_size=4):
        await batch.ack()
    await asyncio.wait_for(job.wait(), 60)
    manifest = await StreamStore(job.id).manifest()
    assert manifest is not None and (manifest.delivered, manifest.pages) == (rows, 4)
    assert manifest.cursors == {"trainer": rows}

    seen: list[str] = []

    async def read(consumer: str, stop_after: int | None = None) -> list[str]:
        closed = await Job.attach(job.id, temporal=client, worker=False)  # nothing answers queries
        got = []
        async for batch in closed.stream(consumer=consumer, batch_size=4):
            got += [r.group_id for r in batch.records]
            await batch.ack()
            if stop_after is not None and len(got) >= stop_after:
                break
        return got

    seen += await read("c2", stop_after=4)
    assert len(seen) == 4
    seen += await read("c2")  # the rest, after a restart
    assert await read("c2") == [] and await read("trainer") == []
    assert len(seen) == len(set(seen)) == rows
    assert await StreamStore(job.id).cursor("c2") == rows
    again = await Job.attach(job.id, temporal=client, worker=False)
    stream = again.stream(consumer="c3", batch_size=2)
    first = await anext(stream)
    with pytest.raises(ConfigError, match="unknown batch 4-6"):
        await first.reader.ack(4, 6)
    assert await first.ack() == 2 and await first.ack() == 2  # a repeat is harmless
    await stream.aclose()


def _applied_groups(log: Path, acks: Path) -> tuple[list[tuple[int, int]], list[str], list[str]]:
    """(spans, groups, rollouts) of the batches the consumer acknowledged, in order; a batch
    received again after a kill must be the very same groups."""
    received: dict[str, dict] = {}
    for batch in _applied(log):
        earlier = received.setdefault(batch["batch"], batch)
        assert earlier["groups"] == batch["groups"], (earlier, batch)
    ids = read_lines(acks)
    spans = [tuple(int(x) for x in b.split(":")[1].split("-")) for b in ids]
    groups = [g for b in ids for g in received[b]["groups"]]
    rollouts = [r for b in ids for r in received[b]["rollouts"]]
    return spans, groups, rollouts  # type: ignore[return-value]


@pytest.mark.slow  # SIGKILLs a trainer three times and a worker twice (~1-2 min)
@pytest.mark.timeout(300)  # a loaded box (CI's HUD lane beside it) stretches its waits
async def test_paged_stream_survives_trainer_and_worker_kills_each_group_applied_once(
        client, dev_server, task_queue, tmp_path: Path, monkeypatch) -> None:
    from temporal_helpers import WorkerProcess

    monkeypatch.setenv("ROLLOUTS_QUEUE_TIMEOUT", "3")  # a killed worker's substrates: gone soon
    monkeypatch.setenv("ROLLOUTS_AGENT_HEARTBEAT", "5")  # and its agent steps noticed soon
    groups = 60
    workers = [WorkerProcess(dev_server.address, task_queue)]
    killed: list[int] = []
    agents = tmp_path / "agents.log"
    job = await _rows(groups).start(
        CountingAgent(answer="x", seconds=0.2, log=str(agents)), runtime=LocalRuntime(ENV_FILE),
        group=2, max_concurrent=8, temporal=client, worker=False, task_queue=task_queue,
        linger_s=300, consumers=["trainer"], max_in_flight=IN_FLIGHT, page_size=PAGE,
        max_history_events=400)
    wid = workflow_id(job.id)
    kept: list[KeptState] = []
    polling = True

    async def poll() -> None:
        while polling:
            try:
                kept.append(await client.get_workflow_handle(wid).query(
                    TasksetRun.stream_kept, rpc_timeout=timedelta(seconds=5)))
            except Exception:  # noqa: BLE001 - between runs, a killed worker, or closed
                pass
            await asyncio.sleep(0.2)

    def kill_worker() -> None:
        killed.append(workers[-1].pid)
        workers[-1].kill()
        workers.append(WorkerProcess(dev_server.address, task_queue))

    poller = asyncio.ensure_future(poll())
    log, acks = tmp_path / "trainer.log", tmp_path / "trainer.acks"
    late_log, late_acks = tmp_path / "late.log", tmp_path / "late.acks"
    procs: list[subprocess.Popen[str]] = []
    loop = asyncio.get_running_loop()

    def consumer(name: str, out: Path, done: Path, *extra: str) -> subprocess.Popen[str]:
        procs.append(_consumer(dev_server.address, job.id, name, out, "--acks", str(done), *extra))
        return procs[-1]

    try:
        for kill in range(3):  # a trainer that dies between receiving its 3rd batch and its ack
            proc = consumer("trainer", log, acks, "--batch-size", "2", "--hang-at", "3")
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 180)
            assert line.strip() == "HANGING", line
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if kill < 2:
                kill_worker()  # and a worker, with rollouts in flight, twice
        trainer = consumer("trainer", log, acks, "--batch-size", "2")
        await async_wait_for(lambda: len(read_lines(acks)) * 2 >= groups * 3 // 5, timeout=240,
                             what="the trainer to apply most groups")
        await async_wait_for(lambda: bool(kept) and kept[-1].base >= groups // 3, timeout=120,
                             what="a third of the groups to be paged")
        paged_when_late, late_at = kept[-1].base, len(kept)
        late = consumer("late", late_log, late_acks, "--batch-size", "3")
        for proc in (trainer, late):
            out, _ = await asyncio.wait_for(loop.run_in_executor(None, proc.communicate, None), 240)
            assert "DONE" in out, out
        done = await asyncio.wait_for(job.wait(), 120)
    finally:
        polling = False
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        await poller
        for worker in workers:
            worker.stop()
    final = sorted(r.rollout_id for r in done.runs)
    assert len(final) == len(set(final)) == 2 * groups
    for name, (out, done_file) in {"trainer": (log, acks), "late": (late_log, late_acks)}.items():
        spans, applied, rollouts = _applied_groups(out, done_file)
        assert spans[0][0] == 0 and spans[-1][1] == groups and \
            all(a[1] == b[0] for a, b in itertools.pairwise(spans)), (name, spans)
        assert len(applied) == len(set(applied)) == groups, name  # each group applied once
        assert sorted(rollouts) == final, name
    # Received three times before an ack and killed: the trainer got those batches again.
    assert len(_applied(log)) == len(read_lines(acks)) + 3
    # No rollout ran twice, except ones in flight on a killed worker.
    runs = [line.split() for line in read_lines(agents)]
    for rid in {r for _, r in runs}:
        pids = [int(pid) for pid, r in runs if r == rid]
        assert all(pid in killed for pid in pids[:-1]), (rid, pids, killed)
    assert len(killed) == 2 and paged_when_late >= groups // 3
    assert max(k.kept_groups for k in kept[:late_at]) <= IN_FLIGHT + 2 * PAGE, kept[:late_at]
    assert max(k.kept_groups for k in kept) <= groups // 2
    assert max(await _carries(client, wid)) < 64 * 1024
    replay = await replay_positions(client, wid, group=2)
    assert len(replay.positions) == groups
    assert_handed_as_replayed(_handed([log, late_log]), replay)


async def test_streamed_batch_histories_of_an_earlier_release_replay() -> None:
    """Histories recorded before stream pages existed (c39e162) replay on the current code."""
    from temporalio.client import WorkflowHistory

    replayer = Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter())
    files = sorted((HERE / "histories").glob("TasksetRun-stream-c39e162-*.json"))
    assert len(files) == 2
    for path in files:
        result = await replayer.replay_workflow(WorkflowHistory.from_json("stream", path.read_text()),
                                                raise_on_replay_failure=False)
        assert result.replay_failure is None, (path.name, result.replay_failure)


async def test_a_recorded_stream_delivers_its_groups_in_the_order_they_finished() -> None:
    """The first run of a paged stream recorded at 3aa528b by the kill test above (26 groups of
    2, one worker SIGKILLed). Replayed from scratch, the batch delivers its groups in the order
    their last child-completion event came. 3aa528b itself put some of them in rollout-id order
    instead, and which ones depended on how events were batched into workflow tasks, so a worker
    that replayed after a kill could hand a consumer other groups at positions it had handed out
    (the bug the kill test found in CI)."""
    from temporalio.client import WorkflowHistory

    path = HERE / "histories" / "TasksetRun-stream-kills-3aa528b.json"
    replay = await replay_histories([WorkflowHistory.from_json("stream", path.read_text())], group=2)
    assert len(replay.finished) == len(replay.positions) == 26
    assert replay.in_order() == replay.finished


async def test_an_unregistered_consumer_holds_nothing_and_resumes_from_its_cursor(
        client, dev_server, task_queue, tmp_path: Path) -> None:
    rows = 12
    job = await _rows(rows).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                  temporal=client, worker=True, task_queue=task_queue,
                                  consumers=["trainer", "eval"], page_size=2, linger_s=120)
    handle = client.get_workflow_handle(workflow_id(job.id))
    evals = job.stream(consumer="eval", batch_size=2)
    first = await anext(evals)  # eval applies two groups, then goes away without a word
    assert await first.ack() == 2
    await evals.aclose()
    trainer = [g async for b in job.stream(consumer="trainer", batch_size=3) for g in await _acked(b)]
    assert len(trainer) == rows
    kept = await handle.query(TasksetRun.stream_kept)
    assert (kept.base, kept.kept_groups) == (2, rows - 2)  # eval's cursor holds the rest in state

    with pytest.raises(ConfigError, match="not registered"):
        await job.unregister("nobody")
    with pytest.raises(ConfigError, match="consumer name"):
        await job.unregister("bad name!")
    cli = await asyncio.create_subprocess_exec(  # the worker is in this process: don't block it
        sys.executable, "-m", "durable_rollouts.cli", "stream", job.id, "--consumer", "eval",
        "--unregister", "--temporal", dev_server.address,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0 and "unregistered, its cursor at group 2" in out.decode(), err.decode()

    # The trainer, the only consumer left, has acknowledged everything: the job closes (its rest
    # to pages, eval's cursor in the manifest), without waiting out its linger time.
    done = await asyncio.wait_for(job.wait(), 60)
    assert len(done.runs) == rows
    manifest = await StreamStore(job.id).manifest()
    assert manifest is not None and manifest.cursors == {"trainer": rows, "eval": 2}
    assert len(_stored_pages(job.id)) == rows // 2
    assert await job.unregister("eval") == 2  # closed: nothing held, its cursor as stored

    # eval comes back under its name: it resumes at its cursor and reads the rest from pages
    back = [b async for b in job.stream(consumer="eval", batch_size=4) if await b.ack()]
    assert [b.id for b in back] == ["eval:2-6", "eval:6-10", "eval:10-12"]
    eval_groups = [r.group_id for r in first.records] + [r.group_id for b in back for r in b.records]
    assert eval_groups == [r.group_id for r in trainer]  # the same groups, the same order, once
    assert await StreamStore(job.id).cursor("eval") == rows


async def _acked(batch) -> list:  # type: ignore[no-untyped-def]
    await batch.ack()
    return batch.records
