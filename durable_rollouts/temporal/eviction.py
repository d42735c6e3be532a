"""Evict the workflow runs a stopped temporalio worker still holds in its cache.

temporalio 1.35's worker shutdown does not evict idle cached runs: sdk-core reports shutdown done
once no run has pending work, so a run suspended on an activity (a rollout in its agent step) stays
in the Python worker's map as suspended coroutines. Python closes them later, during garbage
collection, on whatever thread happens to collect: ``GeneratorExit`` then runs the workflow's
``finally`` blocks inside another workflow's activation, and a command started there (our
teardown step) lands in that other workflow (sdk-python issue #494; the fix, PR #1849, is in no
release). In one process that stops a worker mid-batch and then starts another (a notebook, the
test suite, a worker-lease hand-over) this showed up as a foreign activity command in a replay.

``evict_cached(worker)`` runs temporalio's own eviction (a ``remove_from_cache`` activation: every
task cancelled, every command refused) for each run left, once the worker has stopped. It reads
two private attributes of temporalio's worker; if a later release renames them (or evicts on
shutdown itself) there is nothing left to evict and this does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from temporalio.bridge.proto.workflow_activation import (
    RemoveFromCache,
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.worker import Worker

__all__ = ["cached_runs", "evict_cached"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _running_loop_kept() -> Iterator[None]:
    """Keep this thread's running-loop registration across an activation run here: an
    activation sets its own loop while it runs and leaves none behind."""
    main = asyncio._get_running_loop()
    try:
        yield
    finally:
        asyncio._set_running_loop(main)


def cached_runs(worker: Worker) -> dict[str, Any]:
    """The runs ``worker`` still caches, by run id (empty if temporalio hides them)."""
    workflows = getattr(worker, "_workflow_worker", None)
    running = getattr(workflows, "_running_workflows", None)
    return running if isinstance(running, dict) else {}


def evict_cached(worker: Worker) -> int:
    """Evict every run ``worker`` still caches once it has stopped; returns how many.

    Does nothing while the worker runs (``is_shutdown`` unset): no activation may run alongside.
    """
    if not worker.is_shutdown:
        return 0
    running = cached_runs(worker)
    evicted = 0
    for run_id, cached in list(running.items()):
        job = WorkflowActivationJob(remove_from_cache=RemoveFromCache(
            message="worker shut down", reason=RemoveFromCache.EvictionReason.LANG_REQUESTED))
        try:
            with _running_loop_kept():
                cached.activate(WorkflowActivation(run_id=run_id, jobs=[job]))
        except BaseException as exc:  # noqa: BLE001 - a run that refuses eviction stays cached
            log.warning("could not evict workflow run %s at worker shutdown: %s", run_id, exc)
            continue
        running.pop(run_id, None)
        evicted += 1
    return evicted
