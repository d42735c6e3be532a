"""Test-only fault injection for crash tests: SIGKILL a worker at a named point, once.

Set ``ROLLOUTS_FAULTS`` to a comma-separated list of points (e.g. ``after_grade``) and
``ROLLOUTS_FAULTS_DIR`` to a directory, and run the worker as ``python -m fault_worker`` (this
directory on ``PYTHONPATH``; ``WorkerProcess`` does both). At a listed point the process SIGKILLs
itself, after creating the marker file ``<dir>/<point>.fired`` so that the fault fires only once
across all worker processes. The points are placed by :class:`FaultInterceptor`, an activity
interceptor on the product worker: ``after_provision``, ``after_connect``, ``after_start``,
``after_agent``, ``after_grade``, ``after_verify`` (the activity function returned, so the step
did its work, and its result is not recorded yet), ``before_teardown`` (the substrate is still
up) and ``after_teardown``; local activities pass the interceptor too, so every one of the
card's steps has its points. Inside the agent step, :func:`arm_checkpoint_faults` wraps
``AgentCheckpoints.save`` in the worker process: ``after_tool`` (a tool call ran, its result is
not durable yet) and ``after_checkpoint`` (the checkpoint is durable, nothing after it is). The
product code knows nothing of this.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_rollouts.workflows import types as wf

__all__ = ["AFTER", "BEFORE", "FaultInterceptor", "arm_checkpoint_faults", "maybe_crash"]

# activity name -> the point reached once it returned / before it runs
AFTER = {wf.ACT_PROVISION: "after_provision", wf.ACT_CONNECT: "after_connect",
         wf.ACT_START: "after_start", wf.ACT_AGENT: "after_agent", wf.ACT_GRADE: "after_grade",
         wf.ACT_VERIFY: "after_verify", wf.ACT_TEARDOWN: "after_teardown"}
BEFORE = {wf.ACT_TEARDOWN: "before_teardown"}


def maybe_crash(point: str) -> None:
    """SIGKILL the current process if ``point`` is armed and has not fired yet."""
    armed = os.environ.get("ROLLOUTS_FAULTS", "")
    folder = os.environ.get("ROLLOUTS_FAULTS_DIR")
    if not armed or not folder or point not in {p.strip() for p in armed.split(",")}:
        return
    marker = Path(folder) / f"{point}.fired"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


class _FaultInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = activity.info().activity_type
        if name in BEFORE:
            maybe_crash(BEFORE[name])
        result = await self.next.execute_activity(input)
        if name in AFTER:  # only when the step succeeded, as a crash right before recording
            maybe_crash(AFTER[name])
        return result


class FaultInterceptor(Interceptor):
    """Arms the fault points around the rollout activities (see the module docstring)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _FaultInbound(next)


def arm_checkpoint_faults() -> None:
    """Place ``after_tool`` / ``after_checkpoint`` around the agent step's checkpoints."""
    from durable_rollouts.activities import checkpoints

    save = checkpoints.AgentCheckpoints.save

    async def faulty_save(self: Any, checkpoint: Any) -> None:
        if checkpoint.steps and checkpoint.steps[-1].source == "tool":
            maybe_crash("after_tool")
        await save(self, checkpoint)
        maybe_crash("after_checkpoint")

    checkpoints.AgentCheckpoints.save = faulty_save  # type: ignore[method-assign]
