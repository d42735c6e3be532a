"""Follow a running batch: a live rich progress bar.

The bar shows done/total, succeeded/failed/running counts and the mean reward; it is drawn on
stderr so ``--json`` output on stdout stays clean (a non-terminal gets one final line). Its data
comes from ``live.Feed`` (the in-process board, the ``progress`` query now and then), read and
redrawn at ``live.RENDER_HZ``. Imports rich and the workflow models only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ..workflows.types import Progress as BatchProgress
from .live import RENDER_HZ, Feed

__all__ = ["describe_progress", "follow"]

def describe_progress(p: BatchProgress | None) -> str:
    """One line of counters, e.g. ``ok 3 · failed 1 · running 2 · reward 0.750``."""
    if p is None:
        return "waiting for a worker"
    failed = p.failed + p.errored + p.timeout + p.cancelled
    mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    return f"ok {p.succeeded} · failed {failed} · running {p.running} · reward {mean}"


async def follow(handle: Any, console: Console, *, total: int, label: str) -> Any:
    """Draw progress until the batch behind ``handle`` closes; return its result (or raise)."""
    result = asyncio.ensure_future(handle.result())
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=console,
        refresh_per_second=RENDER_HZ,
    )
    feed = Feed(handle, total)
    task = bar.add_task(label, total=total, stats=describe_progress(None))
    try:
        with bar:
            while not result.done():
                if not console.is_terminal:  # nothing is drawn until the end: read nothing
                    await asyncio.wait({result})
                    break
                p = await feed.read()
                if p is not None:
                    bar.update(
                        task,
                        completed=p.finished,
                        total=p.total or total,
                        stats=describe_progress(p),
                    )
                await asyncio.wait({result}, timeout=1 / RENDER_HZ)
            p = getattr(result.result(), "progress", None) if result.exception() is None else None
            if p is not None:
                bar.update(
                    task, completed=p.finished, total=p.total or total, stats=describe_progress(p)
                )
        return result.result()
    finally:
        if not result.done():
            result.cancel()
            with contextlib.suppress(BaseException):
                await result
