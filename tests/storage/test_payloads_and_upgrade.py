"""Any payload size through the converter (a >2 MB workflow update), and claim checks of the
last release (``file://`` traces, result chunks and row files) still read after the upgrade."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from durable_rollouts.models import RolloutResult, Task, Trace
from durable_rollouts.stores.results import ResultStore
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.workflows.types import ResultsRef


@workflow.defn(name="StorageTestCheckpoints", sandboxed=False)
class Checkpoints:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    @workflow.run
    async def run(self) -> list[int]:
        await workflow.wait_condition(lambda: len(self.sizes) >= 2)
        return self.sizes

    @workflow.update
    async def checkpoint(self, state: dict[str, str]) -> int:
        self.sizes.append(len(state["blob"]))
        return len(state["blob"])


async def test_a_3mb_update_argument_and_result_pass_through_external_storage(s3_storage, s3_server,
                                                                              dev_server) -> None:
    """A workflow update carrying 3 MB (an agent checkpoint's size class) is accepted: the
    converter stores it in the bucket and history holds only a reference; the handler and the
    workflow result see the full value."""
    from durable_rollouts.temporal.connection import connect_client

    _, bucket = s3_storage
    client: Client = await connect_client(dev_server.address)
    queue = f"ckpt-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Checkpoints]):
        handle = await client.start_workflow(Checkpoints.run, id=f"ckpt-{uuid.uuid4().hex}",
                                             task_queue=queue, execution_timeout=timedelta(minutes=2))
        for size in (3_000_000, 10):
            assert await handle.execute_update(Checkpoints.checkpoint, {"blob": "c" * size}) == size
        assert await handle.result() == [3_000_000, 10]
        history = await handle.fetch_history()
    assert max(e.ByteSize() for e in history.events) < 100_000
    assert any(size > 3_000_000 for size in s3_server.objects(bucket).values())


def test_file_claim_checks_of_the_last_release_still_read(tmp_path: Path, monkeypatch) -> None:
    """TraceRefs, ResultsRefs and rows_ref written as ``file://`` paths (release f54ad67) read
    back unchanged; new ones are ``rollouts-storage:`` claims."""
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROLLOUTS_STORAGE", raising=False)
    trace = Trace(trace_id="t1", content="old answer")
    old_trace = tmp_path / "traces" / "t1.json"
    old_trace.parent.mkdir()
    old_trace.write_text(trace.model_dump_json())
    assert TraceStore().get(old_trace.as_uri()).content == "old answer"

    result = RolloutResult(rollout_id="r1", slug="s", group_id="g", group_index=0, status="succeeded",
                           reward=1.0)
    chunk = tmp_path / "results" / "b0-c0.jsonl"
    chunk.parent.mkdir()
    chunk.write_text(result.model_dump_json() + "\n")
    assert ResultStore.get(ResultsRef(uri=chunk.as_uri(), count=1)) == [result]

    rows = [Task(env="e", id="t", args={"i": i}) for i in range(3)]
    rows_file = tmp_path / "results" / "rows-b0.jsonl"
    rows_file.write_text("".join(r.model_dump_json(exclude={"slug"}) + "\n" for r in rows))
    assert [r.args["i"] for r in ResultStore.get_rows(rows_file.as_uri(), 1, 3)] == [1, 2]

    new = TraceStore().put(Trace(trace_id="t2", content="new"))
    assert new.uri.startswith("rollouts-storage:") and TraceStore().get(new).content == "new"
