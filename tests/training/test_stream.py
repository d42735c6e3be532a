"""The trainer's stream of finished groups, on a real dev server with real envs.

A consumer process SIGKILLed between receiving a batch and acknowledging it gets exactly that
batch again after its restart, and never one it acknowledged; no rollout runs again (the agent
logs each run, the env each grade). Two consumers each see every group. Back-pressure and
staleness are read from the batch's own history and queries, not from a log of ours;
``drop_sample`` keeps the rest of a group; bad input is a clear error and harms nothing. A batch
with every group started waits without a busy loop, a consumer may register in the batch's first
workflow task, and an update that meets a failed workflow task is sent again until it recovers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from stream_views import count_views
from temporal_helpers import ENV_FILE, CountingAgent, async_wait_for, read_lines
from temporalio.worker import (
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from training_agents import PolicyAgent

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.job import Job
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.live import READ_AHEAD_GROUPS, carve
from durable_rollouts.temporal.stream_reader import Chunk
from durable_rollouts.worker import build_worker
from durable_rollouts.workflows import workflow_id
from durable_rollouts.workflows.stream import AckRequest

HERE = Path(__file__).resolve().parent


def _rows(evidence: Path, n: int) -> Taskset:
    return Taskset("stream", [Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": "x", "grade_log": str(evidence / "grades.log"), "tag": f"row{i}"}) for i in range(n)])


def _consumer(address: str, job_id: str, name: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parent / "temporal"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "stream_consumer.py"), address, job_id, name,
                             str(log), *extra], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def _batches(log: Path) -> list[dict]:
    return [json.loads(line) for line in read_lines(log)]


async def test_a_consumer_killed_before_its_ack_gets_the_same_groups_again(
        client, dev_server, task_queue, tmp_path: Path) -> None:
    agents = tmp_path / "agents.log"
    job = await _rows(tmp_path, 6).start(CountingAgent(answer="x", log=str(agents)),
                                         runtime=LocalRuntime(ENV_FILE), group=2, temporal=client,
                                         worker=True, task_queue=task_queue, linger_s=120,
                                         consumers=["trainer", "eval"])
    log = tmp_path / "trainer.log"
    first = _consumer(dev_server.address, job.id, "trainer", log, "--batch-size", "2", "--hang-at", "2")
    try:
        await async_wait_for(lambda: len(read_lines(log)) == 2, timeout=60, what="two batches")
        os.killpg(first.pid, signal.SIGKILL)  # between receiving batch 2 and acknowledging it
        first.wait(10)
        before = _batches(log)
        second = _consumer(dev_server.address, job.id, "trainer", log, "--batch-size", "2")
        out, _ = await asyncio.get_running_loop().run_in_executor(None, second.communicate, None)
        assert "DONE" in out, out
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    after = _batches(log)[len(before):]
    assert [b["batch"] for b in before] == ["trainer:0-2", "trainer:2-4"]
    assert after[0]["batch"] == before[1]["batch"] and after[0]["groups"] == before[1]["groups"]
    assert before[0]["groups"] not in [b["groups"] for b in after]  # acknowledged: never again
    acked = [g for b in [before[0], *after] for g in b["groups"]]
    assert len(acked) == len(set(acked)) == 6  # every group once
    # Nothing ran again for the trainer's restart: 12 rollouts, 12 agent runs, 12 grades.
    assert len(read_lines(agents)) == 12 and len(read_lines(tmp_path / "grades.log")) == 12
    # A second consumer, in this process, sees every group too.
    other = [batch async for batch in _acked(job.stream(consumer="eval", batch_size=4))]
    assert sorted(g for b in other for g in (r.group_id for r in b.records)) == sorted(acked)
    done = await asyncio.wait_for(job.wait(), 60)  # both consumers caught up: the batch ends
    assert len(done.runs) == 12 and all(r.reward == 1.0 for r in done.runs)


async def _acked(stream):
    async for batch in stream:
        await batch.ack()
        yield batch


async def test_back_pressure_keeps_at_most_max_in_flight_groups_ahead_of_the_consumer(
        client, task_queue, tmp_path: Path) -> None:
    job = await _rows(tmp_path, 6).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                         group=2, temporal=client, worker=True, task_queue=task_queue,
                                         max_in_flight=2)
    seen = 0
    async for batch in job.stream(consumer="trainer"):
        await asyncio.sleep(0.5)  # a slow trainer
        seen += len(batch.records)
        await batch.ack()
    assert seen == 6
    await job.wait()
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    started, acked, worst = set(), 0, 0
    for event in history.events:
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            wid = event.start_child_workflow_execution_initiated_event_attributes.workflow_id
            started.add(wid.rsplit("-", 1)[0])  # the group: the rollout id without its index
            worst = max(worst, len(started) - acked)
        elif event.HasField("workflow_execution_update_accepted_event_attributes"):
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == "stream_ack":
                acked = max(acked, json.loads(request.input.args.payloads[0].data)["end"])
    assert len(started) == 6 and worst == 2, worst


async def test_a_batch_larger_than_max_in_flight_comes_short_instead_of_waiting_forever(
        client, task_queue, tmp_path: Path) -> None:
    """With max_in_flight=2 no third group starts before an ack: batch_size=3 gets batches of 2."""
    job = await _rows(tmp_path, 5).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                         temporal=client, worker=True, task_queue=task_queue,
                                         max_in_flight=2)
    batches = await asyncio.wait_for(_collect(_acked(job.stream(consumer="trainer", batch_size=3))), 90)
    assert [b.id for b in batches] == ["trainer:0-2", "trainer:2-4", "trainer:4-5"]
    await job.wait()


async def _collect(stream):
    return [batch async for batch in stream]


async def test_a_group_sampled_under_an_old_policy_is_resampled_not_delivered(
        client, task_queue, tmp_path: Path) -> None:
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x", seconds=1.5), runtime=LocalRuntime(ENV_FILE),
                                         group=2, temporal=client, worker=True, task_queue=task_queue,
                                         max_staleness=0, policy_version=0)
    await asyncio.sleep(0.5)  # both groups are sampling with version 0
    assert await job.set_policy(1, endpoint="http://127.0.0.1:9/v1") == 1
    batches = [b async for b in _acked(job.stream(consumer="trainer", batch_size=2))]
    records = [r for b in batches for r in b.records]
    assert [r.policy_version for r in records] == [1, 1]  # only fresh groups are delivered
    runs = [run for b in batches for group in b.groups for run in group]
    assert {run.policy_version for run in runs} == {1} and all(run.rollout_id.endswith("-s1") for run in runs)
    view = await job.view("trainer", 0, 10)
    assert view.counts.get("stale_resampled") == 2 and view.policy.endpoint == "http://127.0.0.1:9/v1"
    await job.wait()


async def test_drop_sample_keeps_the_rest_of_the_group(client, task_queue, tmp_path: Path) -> None:
    rows = Taskset("drop", [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": e})
                            for e in ("a", "b")])
    job = await rows.start(PolicyAgent(fail_expected=["b"], fail_members=[1]), runtime=LocalRuntime(ENV_FILE),
                           group=3, temporal=client, worker=True, task_queue=task_queue,
                           on_error="drop_sample")
    batches = [b async for b in _acked(job.stream(consumer="trainer", batch_size=2))]
    records = [r for b in batches for r in b.records]
    assert sorted(rec.size for rec in records) == [2, 3]
    (dropped,) = [rec for rec in records if rec.dropped_samples]
    assert dropped.size == 2 and dropped.dropped_samples == 1
    assert all(r.status == "succeeded" for r in dropped.results)
    assert sorted(r.group_index for r in dropped.results) == [0, 2]  # member 1 failed
    await job.wait()


async def test_bad_stream_input_is_a_clear_error_and_the_job_goes_on(
        client, task_queue, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        await _rows(tmp_path, 1).start(CountingAgent(), runtime=LocalRuntime(ENV_FILE), temporal=client,
                                       worker=True, task_queue=task_queue, max_staleness=-1)
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                         temporal=client, worker=True, task_queue=task_queue,
                                         policy_version=2)
    with pytest.raises(ConfigError, match="consumer name"):
        async for _ in job.stream(consumer="bad name!"):
            pass
    with pytest.raises(ConfigError, match="only go forward"):
        await job.set_policy(1)
    stream = job.stream(consumer="trainer")
    first = await anext(stream)
    with pytest.raises(ConfigError, match="unknown batch 5-6"):
        await job._update("stream_ack", AckRequest(consumer="trainer", start=5, end=6))
    await first.ack()
    await first.ack()  # a repeated ack is harmless
    rest = [b async for b in _acked(stream)]
    assert len(rest) == 1
    finished = await job.wait()
    assert [r.reward for r in finished.runs] == [1.0, 1.0]


async def test_a_restarted_trainer_attaches_by_job_id(client, task_queue, tmp_path: Path) -> None:
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                         temporal=client, worker=True, task_queue=task_queue)
    again = await Job.attach(job.id, temporal=client, worker=False)
    batches = [b async for b in _acked(again.stream(consumer="trainer"))]
    assert len(batches) == 2 and [b.id for b in batches] == ["trainer:0-1", "trainer:1-2"]
    await job.wait()
    with pytest.raises(ConfigError, match="no job"):
        await Job.attach("no-such-job", temporal=client, worker=False)


def _workflow_task_failures(history) -> list[str]:
    return [e.workflow_task_failed_event_attributes.failure.message for e in history.events
            if e.HasField("workflow_task_failed_event_attributes")]


async def test_a_batch_with_every_group_started_waits_without_spinning(
        client, task_queue, tmp_path: Path) -> None:
    # Room for more groups than the batch has: once both are started, nothing is held back, so
    # the batch must wait for its rollouts (not for an ack that is due at once, in a busy loop
    # that trips the deadlock detector and fails the workflow task).
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x", seconds=3.0), runtime=LocalRuntime(ENV_FILE),
                                         group=2, temporal=client, worker=True, task_queue=task_queue,
                                         max_in_flight=4)
    batches = [b async for b in _acked(job.stream(consumer="trainer", batch_size=2))]
    assert sum(len(b.records) for b in batches) == 2
    await job.wait()
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    assert _workflow_task_failures(history) == []


async def test_a_consumer_registering_in_the_first_workflow_task_is_accepted(
        client, task_queue, tmp_path: Path) -> None:
    # No worker yet: the register update waits, and reaches the batch in its very first workflow
    # task, before the run method started. The stream must already be there for its validator.
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                         group=2, temporal=client, worker=False, task_queue=task_queue)
    stream = job.stream(consumer="trainer", batch_size=2)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(1.0)
    assert not first.done()
    served = await Job.attach(job.id, temporal=client, worker=True, task_queue=task_queue)  # a worker now
    batch = await asyncio.wait_for(first, 60)
    await batch.ack()
    assert [r.size for r in batch.records] == [2, 2]
    await served.wait()
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    assert _workflow_task_failures(history) == []


class _FailSetPolicy(Interceptor):
    """Test-only fault: the ``set_policy`` handler raises (failing the workflow task) while
    ``budget`` holds failures, one per attempt."""

    def __init__(self, budget: Path) -> None:
        self.budget = budget

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        budget = self.budget

        class Inbound(WorkflowInboundInterceptor):
            async def handle_update_handler(self, input: HandleUpdateInput) -> object:
                left = int(budget.read_text() or 0) if input.update == "set_policy" else 0
                if left > 0:
                    budget.write_text(str(left - 1))
                    raise RuntimeError("injected: the workflow task fails")
                return await super().handle_update_handler(input)

        return Inbound


@pytest.mark.slow  # waits out Temporal's workflow-task retry (~20 s)
async def test_an_update_is_sent_again_until_a_failed_workflow_task_recovers(
        client, task_queue, tmp_path: Path) -> None:
    job = await _rows(tmp_path, 2).start(CountingAgent(answer="x", seconds=2.0), runtime=LocalRuntime(ENV_FILE),
                                         group=2, temporal=client, worker=False, task_queue=task_queue,
                                         policy_version=0)
    budget = tmp_path / "failures"
    budget.write_text("3")
    async with build_worker(client, task_queue=task_queue, interceptors=[_FailSetPolicy(budget)]):
        assert await asyncio.wait_for(job.set_policy(1), 120) == 1
        assert budget.read_text() == "0"
        batches = [b async for b in _acked(job.stream(consumer="trainer", batch_size=2))]
        assert sum(len(b.records) for b in batches) == 2
        await job.wait()
    history = await client.get_workflow_handle(workflow_id(job.id)).fetch_history()
    assert any("injected" in message for message in _workflow_task_failures(history))


def test_read_ahead_carves_full_batches_and_a_short_one_only_at_the_end() -> None:
    groups = [object()] * 10  # carve looks at how many, not at what
    live = Chunk(start=4, groups=groups[:7], done=False, delivered=11)
    assert carve(live, 3) == [(4, 7), (7, 10)]  # the 11th group waits for its batch to fill
    assert carve(Chunk(start=4, groups=groups[:7], done=True, delivered=11), 3) == [(4, 7), (7, 10), (10, 11)]
    # done, but this read stopped short of the end (read-ahead limit): no short batch yet
    assert carve(Chunk(start=0, groups=groups[:5], done=True, delivered=9), 2) == [(0, 2), (2, 4)]
    assert carve(Chunk(start=0, groups=groups[:2], done=False, delivered=2), 3) == []
    assert carve(Chunk(start=0, groups=[], done=True, delivered=0), 3) == []


async def test_a_consumer_behind_the_batch_reads_ahead_one_query_per_many_batches(
        client, task_queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = 40
    job = await _rows(tmp_path, rows).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                            temporal=client, worker=True, task_queue=task_queue,
                                            consumers=["trainer"])
    handle = client.get_workflow_handle(workflow_id(job.id))

    async def delivered() -> int:
        kept = await handle.query("stream_kept")
        return kept["base"] + kept["kept_groups"]

    for _ in range(600):  # every group finished before the trainer reads: it is 40 behind
        if await delivered() == rows:
            break
        await asyncio.sleep(0.1)
    views = count_views(monkeypatch)
    batches = [b async for b in _acked(job.stream(consumer="trainer", batch_size=1))]
    assert [b.id for b in batches] == [f"trainer:{i}-{i + 1}" for i in range(rows)]
    assert len({r.group_id for b in batches for r in b.records}) == rows
    # one query per READ_AHEAD_GROUPS groups (and one that finds the end), not one per batch
    assert views() <= -(-rows // READ_AHEAD_GROUPS) + 1, views()
    done = await asyncio.wait_for(job.wait(), 60)
    assert len(done.runs) == rows and len(read_lines(tmp_path / "grades.log")) == rows


async def test_pipelined_acks_go_as_one_update_per_round_trip_and_lose_nothing(
        client, task_queue, tmp_path: Path) -> None:
    """``ack(wait=False)``: a consumer 40 groups behind acks each batch of 1 at once; the reader
    keeps one ack in flight and records the ones sent meanwhile as one range, so the batch takes
    far fewer than 40 acks; at the stream's end every ack is recorded (the job closes, and the
    consumer reading again gets nothing). A pipelined ack out of order is one clear error."""
    rows = 40
    job = await _rows(tmp_path, rows).start(CountingAgent(answer="x"), runtime=LocalRuntime(ENV_FILE),
                                            temporal=client, worker=True, task_queue=task_queue,
                                            consumers=["trainer"])
    handle = client.get_workflow_handle(workflow_id(job.id))
    for _ in range(600):  # every group finished before the trainer reads
        kept = await handle.query("stream_kept")
        if kept["base"] + kept["kept_groups"] == rows:
            break
        await asyncio.sleep(0.1)
    seen: list[str] = []
    stream = job.stream(consumer="trainer", batch_size=1)
    async for batch in stream:
        if not seen:
            with pytest.raises(ConfigError, match="unknown batch 5-6"):
                await batch.reader.ack(5, 6, wait=False)
        seen.extend(r.group_id for r in batch.records)
        assert await batch.ack(wait=False) <= batch.end  # recorded up to here, or not yet
    assert len(seen) == len(set(seen)) == rows
    done = await asyncio.wait_for(job.wait(), 60)  # closes: the consumer caught up, recorded
    assert len(done.runs) == rows
    acks = 0
    async for event in handle.fetch_history_events():
        accepted = event.workflow_execution_update_accepted_event_attributes
        if event.HasField("workflow_execution_update_accepted_event_attributes") \
                and accepted.accepted_request.input.name == "stream_ack":
            acks += 1
    assert 1 <= acks < rows / 2, acks
    again = await Job.attach(job.id, temporal=client, worker=False)
    assert [b async for b in again.stream(consumer="trainer")] == []

