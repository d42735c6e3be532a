"""The agent of ``bench_width.py``: waits, and counts how many wait at once in this process.

In its own module (not the script) so a worker built apart from ``Taskset.run``'s can import it.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from durable_rollouts import Agent


class WaitAgent(Agent):
    """Sleeps ``seconds`` (an agent waiting on a model server), then answers; counts how many
    are waiting at once in this process (the in-process worker runs it here)."""

    seconds: float = 60.0
    waiting: ClassVar[int] = 0
    started: ClassVar[int] = 0
    first: ClassVar[float] = 0.0  # time.monotonic() of the first start since ``started`` was reset

    async def __call__(self, run) -> None:  # type: ignore[no-untyped-def]
        if not type(self).started:
            type(self).first = time.monotonic()
        type(self).waiting += 1
        type(self).started += 1
        try:
            await asyncio.sleep(self.seconds)
        finally:
            type(self).waiting -= 1
        run.trace.content = "2"
