"""The agent of ``bench_tail.py``: most rollouts take ``fast`` seconds, every ``every``-th row
``slow`` seconds (a heavy tail, as agentic rollouts have). In its own module so a worker can
import it."""

from __future__ import annotations

import asyncio

from durable_rollouts import Agent


class TailAgent(Agent):
    fast: float = 1.0
    slow: float = 20.0
    every: int = 10

    async def __call__(self, run) -> None:  # type: ignore[no-untyped-def]
        row = int(run.task.args["word"][1:-2])  # letter_tasks: "w<i>rr"
        await asyncio.sleep(self.slow if row % self.every == 0 else self.fast)
        run.trace.content = "2"
