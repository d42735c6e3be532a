"""The one backoff of the package: doubling delays with a cap, and a retry loop built on them.

Work that runs as a Temporal activity is retried by Temporal's retry policy instead; this is for
the waits and calls made *inside* one step or one process: polling a port until it accepts, a
control-channel ``hello`` until the env server answers, a model request, opening a capability.
Shared by every layer, so it imports nothing of ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

__all__ = ["delays", "retry"]

T = TypeVar("T")


def delays(first_s: float, max_s: float = float("inf")) -> Iterator[float]:
    """``first_s``, then twice the previous delay, at most ``max_s``; endless."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


async def retry(call: Callable[[], Awaitable[T]], *, attempts: int, first_delay_s: float,
                transient: Callable[[Exception], bool], max_delay_s: float = float("inf")) -> T:
    """``await call()`` up to ``attempts`` times; sleep ``first_delay_s`` (doubling, at most
    ``max_delay_s``) after each failure that ``transient(exc)`` accepts.

    Raises:
        Exception: the last attempt's error, or the first one that is not transient.
    """
    pauses = delays(first_delay_s, max_delay_s)
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts or not transient(exc):
                raise
        await asyncio.sleep(next(pauses))
    raise AssertionError("attempts must be >= 1")
