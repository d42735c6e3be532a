"""The ``Rollout`` workflow's side of durable agent turns: checkpoint state and its checks.

The agent activity sends ``checkpoint`` (a delta of trace steps plus the agent's state) and, on a
retried attempt, ``latest_checkpoint``; the ``Rollout`` workflow's update handlers hand both to
:class:`AgentTurns`, which keeps them in memory only, so replay rebuilds them from the update
events. Nothing here adds a command (replay-safe against histories without checkpoints).
Validators reject updates outside the agent phase and from a superseded (zombie) attempt: the
newest ``CheckpointFence`` seen wins. Deterministic: imports only temporalio and the pure models.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.step_io import Checkpoint, CheckpointFence

__all__ = ["AgentTurns"]


class AgentTurns:
    """What a Rollout run keeps between agent attempts: its phase and the newest checkpoint.

    Both the present shape and the frozen legacy runs (``legacy``) are AgentTurns; each sets
    ``_phase`` as it goes and answers ``_patched`` for the patch of checkpoint schedules.
    """

    def __init__(self) -> None:
        self._phase = "pending"
        self._attempt = 0
        self._checkpoint: Checkpoint | None = None  # the latest one, with all its steps
        self._fence: tuple[int, int] = (0, 0)  # the newest (schedule, attempt) seen
        self._agent_schedules = 0

    def _patched(self, patch_id: str) -> bool:
        raise NotImplementedError

    def phase(self) -> dict[str, Any]:
        """The ``phase`` query's answer."""
        return {"phase": self._phase, "attempt": self._attempt}

    def _fresh_agent_schedule(self) -> int:
        """A new schedule of the agent step: fences off every earlier one; returns its number.

        In a run whose agent step was first scheduled by a release before checkpoints (an old
        history continued by this worker) every schedule is number 0, as its inputs say: the
        fence then orders attempts only.
        """
        if not self._patched("agent-checkpoint-schedules"):
            return 0
        self._agent_schedules += 1
        self._fence = max(self._fence, (self._agent_schedules, 0))
        return self._agent_schedules

    def keep(self, checkpoint: Checkpoint) -> int:
        """Keep the agent's newest checkpoint (a delta of trace steps); returns the step count."""
        self._fence = max(self._fence, checkpoint.fence.key())
        steps = self._checkpoint.steps[:checkpoint.first_step] if self._checkpoint else []
        steps.extend(checkpoint.steps)
        self._checkpoint = checkpoint.model_copy(update={"steps": steps, "first_step": 0})
        tool = f", last tool {checkpoint.last_tool}" if checkpoint.last_tool else ""
        workflow.set_current_details(
            f"agent turn {checkpoint.turn}{tool} ({len(steps)} trace steps)")
        return len(steps)

    def check(self, checkpoint: Checkpoint) -> None:
        """Validate a ``checkpoint`` update (raises ValueError to reject it)."""
        self.check_fence(checkpoint.fence)
        have = len(self._checkpoint.steps) if self._checkpoint else 0
        if checkpoint.first_step > have:
            raise ValueError(
                f"checkpoint starts at step {checkpoint.first_step}, only {have} are kept")

    def latest(self, fence: CheckpointFence) -> Checkpoint | None:
        """The newest checkpoint, for a retried agent attempt (which fences off older ones)."""
        self._fence = max(self._fence, fence.key())
        return self._checkpoint

    def check_fence(self, fence: CheckpointFence) -> None:
        """Reject an update outside the agent phase or from a superseded attempt."""
        if self._phase != "agent loop":
            raise ValueError(f"no agent step is running (phase {self._phase})")
        if fence.key() < self._fence:
            raise ValueError(f"stale agent attempt {fence.key()}: attempt {self._fence} took over")
