"""Follow a running batch: a live rich progress bar fed by the ``progress`` query.

The bar shows done/total, succeeded/failed/running counts and the mean reward; it is drawn on
stderr so ``--json`` output on stdout stays clean (a non-terminal gets one final line). Imports
temporalio, rich and the workflow names only.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
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

from ..workflows import TasksetRun
from ..workflows.types import Progress as BatchProgress

__all__ = ["describe_progress", "follow"]

POLL_S = 0.5


def describe_progress(p: BatchProgress | None) -> str:
    """One line of counters, e.g. ``ok 3 · failed 1 · running 2 · reward 0.750``."""
    if p is None:
        return "waiting for a worker"
    failed = p.failed + p.errored + p.timeout + p.cancelled
    mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    return f"ok {p.succeeded} · failed {failed} · running {p.running} · reward {mean}"


async def _query(handle: Any) -> BatchProgress | None:
    try:
        return await handle.query(TasksetRun.progress, rpc_timeout=timedelta(seconds=2))
    except Exception:  # noqa: BLE001 - no worker yet, or the run just continued-as-new
        return None


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
    )
    task = bar.add_task(label, total=total, stats=describe_progress(None))
    try:
        with bar:
            while not result.done():
                p = await _query(handle)
                if p is not None:
                    bar.update(
                        task,
                        completed=p.finished,
                        total=p.total or total,
                        stats=describe_progress(p),
                    )
                await asyncio.wait({result}, timeout=POLL_S)
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
