"""What an incompatible workflow change looks like, and that ``workflow.patched`` avoids it.

``ProbeRollout`` is a test-only copy of ``Rollout`` (same workflow name) that schedules one extra
activity before the agent step, the kind of change a release might make. Unpatched, a golden
history no longer replays and the error names both activities; behind ``workflow.patched`` it
replays. Live, a worker with the changed code fails the workflow task of a running batch with a
``WorkflowTaskFailed`` event (cause NON_DETERMINISTIC_ERROR) whose identity names the worker's
release, while the batch's ``rollouts_release`` memo names the release that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporal_helpers import ENV_FILE
from temporalio import workflow
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.workflow import NondeterminismError

from durable_rollouts import worker as worker_module
from durable_rollouts.models import RolloutResult, Task
from durable_rollouts.release import MEMO_KEY, release_name
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import SleepAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.jobs import load_job
from durable_rollouts.temporal.resume import plan_resume, start_resume
from durable_rollouts.workflows import Rollout, TasksetRun, rollout_id
from durable_rollouts.workflows.legacy import LegacyRollout
from durable_rollouts.workflows.rollout import CardRollout
from durable_rollouts.workflows.types import CARD_LAYOUT, RolloutInput

pytestmark = pytest.mark.timeout(90)

GOLDEN = Path(__file__).resolve().parent / "0.1.0-f54ad67"
PROBE = "rollouts.upgrade_probe"


class _Probe:
    """One unpatched extra activity before the agent step (unless ``patch_id`` is patched out)."""

    patch_id: str | None = None

    async def _agent(self, *args: Any) -> Any:
        if self.patch_id is None or workflow.patched(self.patch_id):
            await workflow.execute_activity(PROBE, start_to_close_timeout=timedelta(seconds=5))
        return await super()._agent(*args)  # type: ignore[misc]


class _ProbeLegacy(_Probe, LegacyRollout):
    pass


class _ProbeCard(_Probe, CardRollout):
    pass


@workflow.defn(name="Rollout")
class ProbeRollout(Rollout):
    """Rollout plus one unpatched extra activity before the agent step, in either shape."""

    patch_id: str | None = None

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        shape = _ProbeLegacy() if inp.layout < CARD_LAYOUT else _ProbeCard()
        shape.patch_id = self.patch_id
        self._shape = shape
        return await shape.run(inp)


@workflow.defn(name="Rollout")
class PatchedProbeRollout(ProbeRollout):
    """The same change behind ``workflow.patched``: old histories take the old path."""

    patch_id = "upgrade-probe-before-agent"

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        return await super().run(inp)


def _golden(name: str) -> WorkflowHistory:
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    (entry,) = [f for s in manifest["scenarios"].values() for f in s["files"] if f["file"] == name]
    return WorkflowHistory.from_json(entry["workflow_id"], (GOLDEN / name).read_text())


def _replayer(rollout: type) -> Replayer:
    return Replayer(workflows=[TasksetRun, rollout], data_converter=data_converter(),
                    workflow_runner=UnsandboxedWorkflowRunner())


@pytest.mark.parametrize("name", ["success/Rollout-0.json", "pinned/Rollout-0.json",
                                  "reprovision/Rollout-0.json"])
async def test_an_unpatched_extra_activity_fails_replay_naming_both_activities(name: str) -> None:
    """Replaying a 0.1.0 history on a workflow with an extra activity raises NondeterminismError
    whose message says which recorded activity the new command collided with."""
    with pytest.raises(NondeterminismError) as err:
        await _replayer(ProbeRollout).replay_workflow(_golden(name))
    message = str(err.value)
    assert "Nondeterminism" in message
    assert "'rollouts.agent'" in message and f"'{PROBE}'" in message, message


@pytest.mark.parametrize("name", ["success/Rollout-0.json", "pinned/Rollout-0.json",
                                  "reprovision/Rollout-0.json"])
async def test_the_same_change_behind_workflow_patched_replays_old_histories(name: str) -> None:
    """``workflow.patched`` is False while replaying a history recorded without the patch."""
    await _replayer(PatchedProbeRollout).replay_workflow(_golden(name))


async def _task_failed(client: Any, wid: str) -> Any:
    history = await client.get_workflow_handle(wid).fetch_history()
    for event in history.events:
        if event.HasField("workflow_task_failed_event_attributes"):
            return event.workflow_task_failed_event_attributes
    return None


async def test_a_worker_of_an_incompatible_release_fails_the_task_naming_its_release(
        client, monkeypatch, tmp_path: Path) -> None:
    """A running batch picked up by a worker whose Rollout emits other commands: the workflow
    task fails (not a silent hang) with NON_DETERMINISTIC_ERROR, a readable message and the
    failing worker's release in its identity; the memo names the release that started it.
    The README's recovery works: terminate the batch, `rollouts resume` it on a good worker."""
    queue = f"nde-{tmp_path.name[-12:]}"
    task = Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x"})
    first = worker_module.build_worker(client, task_queue=queue, graceful_shutdown_s=10)
    async with first:
        handle = await start_job(Taskset("nde", [task]), SleepAgent(seconds=2.0, answer="x"),
                                 runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                                 task_queue=queue)
        rid = rollout_id(handle.job.id, task.slug, 0)
        child = client.get_workflow_handle(rid)

        async def in_agent() -> bool:
            try:
                return (await child.query(Rollout.phase))["phase"] == "agent loop"
            except Exception:  # noqa: BLE001 - not started yet
                return False

        for _ in range(200):
            if await in_agent():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the rollout never reached its agent step")
    # the agent finished during the graceful shutdown: its next workflow task awaits a worker
    monkeypatch.setattr(worker_module, "WORKFLOWS", [TasksetRun, ProbeRollout])
    changed = worker_module.build_worker(client, task_queue=queue)
    try:
        async with changed:
            failed = None
            for _ in range(300):
                failed = await _task_failed(client, rid)
                if failed is not None:
                    break
                await asyncio.sleep(0.1)
            assert failed is not None, "no WorkflowTaskFailed event: the workflow is silently stuck"
            assert failed.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR
            assert failed.identity.startswith(release_name() + " "), failed.identity
            assert "Nondeterminism" in failed.failure.message and (
                    PROBE in failed.failure.message or "patch marker" in failed.failure.message)
            memo = await (await handle.handle.describe()).memo()
            assert memo[MEMO_KEY] == release_name()
    finally:
        for wf in (handle.handle, child):
            with contextlib.suppress(Exception):
                await wf.terminate("incompatible worker")
    monkeypatch.undo()
    async with worker_module.build_worker(client, task_queue=queue):
        (plan,) = plan_resume(await load_job(client, handle.job.id), None)
        assert [r.rollout_id for r in plan.rerun] == [rid]
        result = await (await start_resume(client, handle.job.id, plan)).result()
    assert [(r.status, r.reward) for r in result.results] == [("succeeded", 1.0)]

