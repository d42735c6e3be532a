"""Replay a streamed batch and note which group each run delivered at each stream position.

A consumer that applied a batch and died before acknowledging it is handed the same positions
again, from whichever worker then holds the batch (one that replayed the history from scratch
after a kill). So the order live workers gave must be the order a replay of the history rebuilds:
tests compare every (position, group) a consumer was handed with a replay's.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.worker import Replayer

from durable_rollouts.models import RolloutResult
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun
from durable_rollouts.workflows.types import TasksetRunInput, TasksetRunResult

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


async def replay_positions(client, wid: str) -> tuple[int, dict[int, str]]:
    """Replay every run of batch ``wid`` (oldest first); how many runs there were, and the group
    the replays delivered at each position (set once, by the run that delivered it)."""
    replayer = Replayer(workflows=[_PositionProbe, Rollout], data_converter=data_converter())
    runs = [execution async for execution in client.list_workflows(f'WorkflowId="{wid}"')]
    _POSITIONS.clear()
    for execution in sorted(runs, key=lambda e: e.start_time):
        history = await client.get_workflow_handle(wid, run_id=execution.run_id).fetch_history()
        await replayer.replay_workflow(history)
    return len(runs), dict(_POSITIONS)


def assert_handed_as_replayed(handed: set[tuple[int, str]], positions: dict[int, str]) -> None:
    """Every (position, group) a consumer was handed is where the replay put that group."""
    wrong = sorted((seq, gid, positions.get(seq)) for seq, gid in handed if positions.get(seq) != gid)
    assert handed and not wrong, f"handed (position, group, replay's group): {wrong}"
