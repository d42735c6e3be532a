"""The one retry helper of the sdk: call again after a doubling delay while an error is transient.

Work that runs as a Temporal activity is retried by Temporal's retry policy instead; this is for
the few calls made *inside* one step (a model request, opening a capability) where a failed
attempt must not fail the whole step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["retry"]

T = TypeVar("T")


async def retry(call: Callable[[], Awaitable[T]], *, attempts: int, first_delay_s: float,
                transient: Callable[[Exception], bool], max_delay_s: float = float("inf")) -> T:
    """``await call()`` up to ``attempts`` times; sleep ``first_delay_s`` (doubling, at most
    ``max_delay_s``) after each failure that ``transient(exc)`` accepts.

    Raises:
        Exception: the last attempt's error, or the first one that is not transient.
    """
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts or not transient(exc):
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay_s)
    raise AssertionError("attempts must be >= 1")
