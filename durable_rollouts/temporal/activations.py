"""Run workflow activations on the worker's own event loop instead of a thread pool (opt-in).

temporalio hands every workflow activation to ``workflow_task_executor`` (a thread pool by
default) so that a workflow which blocks can be detected (2 s deadlock timeout). With the GIL
the pool adds a thread hop and GIL hand-offs to every activation; running them inline looked
like 14% less worker CPU in a first A/B, which later interleaved runs of
``benchmarks/bench_worker_cpu.py`` did not reproduce. This is the inline path
temporalio takes in its ``debug_mode``, reached through the documented executor parameter.

Off by default (``ROLLOUTS_INLINE_ACTIVATIONS=1`` turns it on, for unsandboxed workers only):
interleaved A/B runs show no measurable gain (``benchmarks/README.md``), and the pool keeps
temporalio's deadlock detection. A foreign activity command once seen in a replay after an
inline worker had stopped was not caused by running inline: temporalio leaves a stopped
worker's cached runs to the garbage collector, whatever the executor (``temporal.eviction``
now evicts them). What inline gives up:
temporalio's deadlock detection; an activation slower than ``SLOW_ACTIVATION_S`` is logged
instead. Pure asyncio + concurrent.futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ENV", "SLOW_ACTIVATION_S", "InlineActivations", "activation_executor", "running_loop_kept"]

log = logging.getLogger(__name__)

ENV = "ROLLOUTS_INLINE_ACTIVATIONS"
SLOW_ACTIVATION_S = 2.0  # temporalio's deadlock timeout


@contextlib.contextmanager
def running_loop_kept() -> Iterator[None]:
    """Run a workflow activation on this thread and keep its running-loop registration: an
    activation sets its own loop while it runs and leaves none behind."""
    main = asyncio._get_running_loop()
    try:
        yield
    finally:
        asyncio._set_running_loop(main)


class InlineActivations(concurrent.futures.ThreadPoolExecutor):
    """An "executor" that runs each submitted call soon on the calling thread's event loop.

    ``submit`` must be called from a running loop (temporalio calls it through
    ``loop.run_in_executor`` from its activation task). The call runs from ``call_soon``, outside
    the submitting task's step, and the thread's running-loop registration (which a workflow
    activation swaps for its own loop) is restored afterwards. No thread is ever started.
    """

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="unused")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # running now, as in a pool thread: never skipped
        loop = asyncio.get_running_loop()

        def run() -> None:
            began = time.monotonic()
            try:
                with running_loop_kept():
                    future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                future.set_exception(exc)
            took = time.monotonic() - began
            if took > SLOW_ACTIVATION_S:
                log.warning("a workflow activation took %.1f s and held the worker's event loop", took)

        loop.call_soon(run)
        return future


def activation_executor(sandboxed: bool) -> concurrent.futures.ThreadPoolExecutor | None:
    """The ``workflow_task_executor`` for a worker: temporalio's pool (None) unless
    ``ROLLOUTS_INLINE_ACTIVATIONS=1`` asks for inline activations of an unsandboxed worker."""
    if sandboxed or os.environ.get(ENV, "0").lower() not in ("1", "true", "yes"):
        return None  # temporalio's own thread pool
    return InlineActivations()
