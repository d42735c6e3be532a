"""Agents for the CLI tests (the CLI and worker subprocesses import them via PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os

from pydantic import Field

from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.run import Run


class FlakyAgent(Agent):
    """Answers by task id from ``answers``; raises for ids in ``fail_ids`` until ``marker`` exists.

    Each call first appends its rollout id to ``log`` (when set) and sleeps ``seconds`` (not
    once ``marker`` exists, with ``fast_after_marker``).
    """

    answers: dict[str, str] = Field(default_factory=dict)
    fail_ids: list[str] = Field(default_factory=list)
    marker: str = ""
    seconds: float = 0.0
    log: str = ""
    fast_after_marker: bool = False

    async def __call__(self, run: Run) -> None:
        if self.log:
            with open(self.log, "a") as fh:  # noqa: ASYNC230 - one short line
                fh.write(run.rollout_id + "\n")
        fixed = bool(self.marker) and os.path.exists(self.marker)
        if not (fixed and self.fast_after_marker):
            await asyncio.sleep(self.seconds)
        task_id = run.task.id if run.task is not None else ""
        if task_id in self.fail_ids and not fixed:
            raise RuntimeError(f"{task_id} fails on purpose until {self.marker} exists")
        run.trace.content = self.answers.get(task_id, "")
