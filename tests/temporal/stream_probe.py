"""Replay a streamed batch and note which group each run delivered at each stream position.

A consumer that applied a batch and died before acknowledging it is handed the same positions
again, from whichever worker then holds the batch (one that replayed the history from scratch
after a kill). So the order live workers gave must be the order a replay of the history rebuilds,
and both must be the order the groups finished in history (the child-completion events, and for
rollouts a previous run carried in, the order ``await_rollouts`` reported them), not an accident
of how events were batched into workflow tasks. Tests compare all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from durable_rollouts.models import RolloutResult
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun
from durable_rollouts.workflows.types import (
    ACT_AWAIT_ROLLOUTS,
    AwaitedRollout,
    TasksetRunInput,
    TasksetRunResult,
)

_POSITIONS: dict[int, str] = {}  # what the replay in progress delivered at each position


@workflow.defn(name="TasksetRun", sandboxed=False)
class _PositionProbe(TasksetRun):
    """The batch workflow as it is, noting the group it delivers at each stream position."""

    @workflow.run
    async def run(self, inp: TasksetRunInput) -> TasksetRunResult:
        return await super().run(inp)

    def _count(self, inp: TasksetRunInput, result: RolloutResult) -> None:
        super()._count(inp, result)
        for group in self._stream.delivered if self._stream is not None else []:
            _POSITIONS.setdefault(group.seq, group.group_id)


@dataclass
class StreamReplay:
    runs: int  # runs of the batch (continue-as-new)
    positions: dict[int, str]  # the group the replays delivered at each position
    finished: list[str]  # groups in the order their last member's completion event came

    def in_order(self) -> list[str]:
        return [self.positions[seq] for seq in sorted(self.positions)]


async def replay_histories(histories: list[WorkflowHistory], group: int) -> StreamReplay:
    """Replay the runs of one streamed batch, oldest first (groups of ``group`` rollouts, every
    one a child that completed: no re-samples, drops or failed children)."""
    replayer = Replayer(workflows=[_PositionProbe, Rollout], data_converter=data_converter())
    _POSITIONS.clear()
    finished: list[str] = []
    ended: dict[str, int] = {}
    for history in histories:
        await replayer.replay_workflow(history)
        for result in await _ended_in_order(history):
            ended[result.group_id] = ended.get(result.group_id, 0) + 1
            if ended[result.group_id] == group:
                finished.append(result.group_id)
    return StreamReplay(len(histories), dict(_POSITIONS), finished)


async def _ended_in_order(history: WorkflowHistory) -> list[RolloutResult]:
    """The rollouts that ended in this run, in history order: its children's completions, and
    the rollouts a previous run carried in, as ``await_rollouts`` reported them."""
    awaits: set[int] = set()
    ended: list[RolloutResult] = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name == ACT_AWAIT_ROLLOUTS:
                awaits.add(event.event_id)
        elif event.HasField("child_workflow_execution_completed_event_attributes"):
            payloads = event.child_workflow_execution_completed_event_attributes.result.payloads
            ended.extend(await data_converter().decode(payloads, [RolloutResult]))
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in awaits:
                (outcomes,) = await data_converter().decode(done.result.payloads, [list[AwaitedRollout]])
                ended.extend(o.result for o in outcomes if o.result is not None)
    return ended


async def replay_positions(client, wid: str, group: int) -> StreamReplay:
    """Replay every run of batch ``wid`` as recorded on the server."""
    runs = [execution async for execution in client.list_workflows(f'WorkflowId="{wid}"')]
    histories = [await client.get_workflow_handle(wid, run_id=e.run_id).fetch_history()
                 for e in sorted(runs, key=lambda e: e.start_time)]
    return await replay_histories(histories, group)


def assert_handed_as_replayed(handed: set[tuple[int, str]], replay: StreamReplay) -> None:
    """Every (position, group) a consumer was handed is where the replay put that group, and the
    replay put the groups in the order they finished."""
    wrong = sorted((seq, gid, replay.positions.get(seq)) for seq, gid in handed
                   if replay.positions.get(seq) != gid)
    assert handed and not wrong, f"handed (position, group, replay's group): {wrong}"
    got, want = replay.in_order(), replay.finished[:len(replay.positions)]
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, f"from position {at}: delivered {got[at:at + 4]}, finished {want[at:at + 4]}"
