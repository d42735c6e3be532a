"""Run a worker process's watch (``workflows.worker_watch``) beside its workers.

``WatchRunner`` polls a queue only this process polls (``<task queue>@<host>:<pid>:watch-<id>``)
with the sentinel activity, on a worker whose heartbeat throttle is a quarter of the watch's
timeout, and keeps one ``WorkerWatch`` workflow running for it on the shared queue. A watch that
ended because this process was taken for dead (it stalled past the timeout) is started again.
Stopping ends the watch first (the sentinel returns ``stopped``), so a worker that shuts down is
never reported lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from durable_rollouts.workflows.worker_watch import BEATS_PER_TIMEOUT, WatchInput, WorkerWatch

__all__ = ["WatchRunner"]

log = logging.getLogger(__name__)

RESTART_S = 5.0  # after a failed start or a watch that ended, try again this much later
STOP_S = 5.0  # at most this long to cancel the watch on shutdown
WATCH_TASK_TIMEOUT = timedelta(seconds=3)


class WatchRunner:
    """One worker process's watch: its sentinel worker and its ``WorkerWatch`` workflow.

    Args:
        client: the worker's client.
        task_queue: the shared queue (where ``WorkerWatch`` runs: any live worker notices).
        sentinel: the sentinel (``activities.watch.WatchActivities`` over the agent steps this
            process runs): its ``worker_alive`` activity and its ``stop()``.
        identity: named in the warning the watch logs when this process is taken for dead.
        timeout_s: missed beats for this long mean dead (``ROLLOUTS_WORKER_WATCH``); 0 = no watch.
    """

    def __init__(self, client: Client, *, task_queue: str, sentinel: Any,
                 identity: str, timeout_s: float) -> None:
        self.client = client
        self.task_queue = task_queue
        self.identity = identity
        self.timeout_s = timeout_s
        self.queue = f"{task_queue}@{socket.gethostname()}:{os.getpid()}:watch-{uuid.uuid4().hex[:8]}"
        throttle = timedelta(seconds=max(timeout_s, 1.0) / BEATS_PER_TIMEOUT)
        # A plugin on the client (``RolloutsPlugin``) would add its workflows, activities and
        # its own watch to this worker too: the sentinel's worker gets the client without them.
        bare = Client(**{**client.config(), "plugins": []})  # type: ignore[arg-type]
        self.worker = Worker(
            bare, task_queue=self.queue, activities=[sentinel.worker_alive],
            max_concurrent_activities=2,
            activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=1),
            max_heartbeat_throttle_interval=throttle, default_heartbeat_throttle_interval=throttle,
            graceful_shutdown_timeout=timedelta(seconds=1), identity=identity)
        self.sentinel = sentinel
        self._handle: WorkflowHandle | None = None
        self._stopping = False
        self.restarts = 0  # watches started again after this process was taken for dead

    async def run(self) -> None:
        """Poll the sentinel queue and keep the watch running, until cancelled."""
        if self.timeout_s <= 0:
            return
        polling = asyncio.ensure_future(self.worker.run())
        try:
            await self._keep()
        finally:
            await self.stop(wait=False)
            # The sentinel's worker is stopped and waited for even when this run is cancelled
            # (again): one left running would outlive its worker (and wedge the loop's end).
            closing = asyncio.ensure_future(self._close(polling))
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                await closing
                raise

    async def _close(self, polling: asyncio.Future[None]) -> None:
        await self.worker.shutdown()
        with contextlib.suppress(BaseException):
            await polling

    async def _keep(self) -> None:
        generation = 0
        while not self._stopping:
            try:
                self._handle = await self.client.start_workflow(
                    WorkerWatch.run, WatchInput(queue=self.queue, identity=self.identity,
                                                timeout_s=self.timeout_s),
                    id=f"worker-watch-{self.queue}-{generation}", task_queue=self.task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    static_summary=f"watch of {self.identity}",
                    # its tasks are tiny; one handed to a hung worker (maybe the watched one, which
                    # cached it) is taken back this soon, not after the default 10 s
                    task_timeout=WATCH_TASK_TIMEOUT)
                result = await self._handle.result()
                if self._stopping:
                    return
                if result.lost or "sentinel" in result.why:
                    log.warning("this worker was taken for dead (%s); %d agent steps were "
                                "scheduled again elsewhere; watching again", result.why, result.lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server restarting, a cancelled watch: try again
                if self._stopping:
                    return
                log.info("worker watch: %s; starting it again", exc)
            self._handle = None
            generation += 1
            self.restarts += 1
            await asyncio.sleep(RESTART_S)

    async def stop(self, *, wait: bool = True) -> None:
        """End the watch quietly (idempotent): this process is shutting down, not lost. The
        sentinel returns ``stopped`` and the watch completes; a watch still waiting for its
        next round is cancelled. ``wait=False`` (the workers already stopped): nothing waits for
        the watch to complete; it does once a worker takes its task."""
        self._stopping = True
        self.sentinel.stop()
        handle, self._handle = self._handle, None
        if handle is None or not wait:
            return
        try:
            await asyncio.wait_for(handle.result(), STOP_S)
        except Exception:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.cancel(), STOP_S)
