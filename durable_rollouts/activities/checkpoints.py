"""The agent activity's side of durable agent turns: checkpoints as updates of the Rollout workflow.

``Run.checkpoint`` (sdk, Temporal-free) calls :meth:`AgentCheckpoints.save`, which sends the
``checkpoint`` update to this activity's own Rollout workflow and returns once the update is
recorded in history (durable). A retried attempt (Temporal reuses the ORIGINAL activity input)
fetches the latest checkpoint itself with the ``latest_checkpoint`` update, which also fences
off older, zombie attempts. Every checkpoint and heartbeat carries the agent's progress (turn,
last tool call) as heartbeat details, for the Web UI.

Without external payload storage in the data converter, a checkpoint whose total (every kept
step plus the state) would pass Temporal's 2 MB payload limit is not sent: checkpointing stops
for this attempt with a warning (a crash then resumes from the last checkpoint that fit), rather
than wedging the workflow on an oversized update.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from durable_rollouts.errors import CheckpointError
from durable_rollouts.step_io import (
    AgentInput,
    Checkpoint,
    CheckpointFence,
)
from durable_rollouts.workflows.types import UPD_CHECKPOINT, UPD_LATEST_CHECKPOINT

__all__ = ["AgentCheckpoints"]

log = logging.getLogger(__name__)

INLINE_LIMIT_BYTES = 1_800_000  # under Temporal's 2 MB payload limit, with room for the envelope


class AgentCheckpoints:
    """Checkpointer and heartbeat of one agent activity attempt."""

    def __init__(self, inp: AgentInput) -> None:
        info = activity.info()
        self.fence = CheckpointFence(schedule=inp.schedule, attempt=info.attempt)
        self.handle = activity.client().get_workflow_handle(info.workflow_id or "",
                                                            run_id=info.workflow_run_id)
        self.progress: dict[str, Any] = {"turn": None, "last_tool": None, "attempt": info.attempt}
        self._local = info.is_local
        self._inline_only = activity.client().data_converter.external_storage is None
        self._steps_bytes = 0  # JSON size of the steps the workflow keeps

    async def restore(self, inp: AgentInput) -> AgentInput:
        """``inp`` with the latest checkpoint: from the input on a first attempt, else fetched."""
        checkpoint = inp.checkpoint
        if self.fence.attempt > 1:
            try:
                checkpoint = await self.handle.execute_update(  # type: ignore[call-overload]
                    UPD_LATEST_CHECKPOINT, self.fence, result_type=Checkpoint | None)
            except WorkflowUpdateFailedError as exc:  # a superseded attempt: stop here
                raise CheckpointError(f"cannot resume the agent: {_cause(exc)}") from exc
            except RPCError as exc:
                raise CheckpointError(f"cannot fetch the agent's checkpoint: {exc}") from exc
        if checkpoint is not None:
            self._steps_bytes = sum(len(s.model_dump_json()) for s in checkpoint.steps)
            self.progress.update(turn=checkpoint.turn, last_tool=checkpoint.last_tool,
                                 resumed_at_step=len(checkpoint.steps))
        return inp.model_copy(update={"checkpoint": checkpoint})

    async def save(self, checkpoint: Checkpoint) -> None:
        """Record ``checkpoint`` in the workflow's history; returns once it is durable."""
        checkpoint.fence = self.fence
        if self.progress.get("checkpoints") == "stopped":
            return
        delta = sum(len(s.model_dump_json()) for s in checkpoint.steps)
        total = self._steps_bytes + delta + len(json.dumps(checkpoint.state))
        if self._inline_only and total > INLINE_LIMIT_BYTES:
            log.warning("agent checkpoints stop at turn %s: over %d bytes and the data converter "
                        "has no external storage", checkpoint.turn, INLINE_LIMIT_BYTES)
            self.progress["checkpoints"] = "stopped"
            return
        try:
            await self.handle.execute_update(UPD_CHECKPOINT, checkpoint)
        except WorkflowUpdateFailedError as exc:
            raise CheckpointError(f"checkpoint refused: {_cause(exc)}") from exc
        except RPCError as exc:
            raise CheckpointError(f"checkpoint not recorded: {exc}") from exc
        self._steps_bytes += delta
        self.progress.update(turn=checkpoint.turn, last_tool=checkpoint.last_tool)
        self.heartbeat()

    def details(self) -> tuple[Any, ...]:
        """Heartbeat details: the agent's progress once it has any (a checkpoint, a resume).

        An agent that never checkpoints heartbeats without details, as before checkpoints
        existed (heartbeats with details kept the in-process worker from exiting now and then)."""
        return (self.progress,) if self.progress["turn"] is not None or len(self.progress) > 3 else ()

    def heartbeat(self) -> None:
        """Heartbeat with the agent's progress as details (shown by the Web UI)."""
        if not self._local:
            activity.heartbeat(*self.details())


def _cause(exc: WorkflowUpdateFailedError) -> str:
    cause = exc.cause
    return str(getattr(cause, "message", None) or cause or exc)
