"""``RolloutsPlugin``: add durable rollouts to your own temporalio Client and Worker.

One temporalio ``SimplePlugin`` bundles what a worker of this package needs: the data converter
(pydantic, plus the payload codec with ``ROLLOUTS_PAYLOAD_KEY``) and the workflows, activities and
interceptors that ``durable_rollouts.worker.worker_parts`` lists (the same as the packaged
worker's)::

    client = await Client.connect("temporal:7233", plugins=[RolloutsPlugin(task_queue="q")])
    async with Worker(client, task_queue="q"):     # the client's plugin configures the worker
        job = await taskset.run(agent, runtime=rt, temporal=client, task_queue="q", worker=False)

``durable_rollouts.worker.build_worker`` remains the packaged worker (it also polls per-host and
per-process queues and runs the gc sweep); this plugin is a single-queue worker. Both evict the
workflow runs a stopped worker still caches (``temporal.eviction``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker

from durable_rollouts.activities import Queues
from durable_rollouts.activities.watch import RunningAgents, WatchActivities
from durable_rollouts.settings import settings
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.temporal.eviction import evict_cached
from durable_rollouts.temporal.watch import WatchRunner
from durable_rollouts.workflows.types import DEFAULT_TASK_QUEUE

__all__ = ["PLUGIN_NAME", "RolloutsPlugin"]

PLUGIN_NAME = "durable_rollouts.RolloutsPlugin"


class RolloutsPlugin(SimplePlugin):
    """Converter, workflows, activities and interceptor of durable rollouts, as one plugin.

    Args:
        task_queue: the queue the worker polls (substrate-local steps are pinned to it, too).
        trace_store: where agent traces are written (default ``$ROLLOUTS_HOME/traces``).
    """

    def __init__(self, *, task_queue: str = DEFAULT_TASK_QUEUE,
                 trace_store: TraceStore | None = None) -> None:
        from durable_rollouts.worker import (
            worker_parts,  # lazy: the worker layer sits above this one
        )

        self._running = RunningAgents()  # the agent steps this process runs, for its watch
        parts = worker_parts(Queues(shared=task_queue), trace_store=trace_store,
                             running=self._running)
        super().__init__(
            PLUGIN_NAME,
            data_converter=data_converter(),
            interceptors=parts.interceptors,
            activities=parts.activities,
            workflows=parts.workflows,
        )

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Run the worker with this process's watch (``temporal.watch``); once it has stopped,
        evict the runs it still caches (``temporal.eviction``: temporalio 1.35 leaves them to
        the garbage collector)."""
        watch = WatchRunner(worker.client, task_queue=worker.task_queue,
                            sentinel=WatchActivities(self._running),
                            identity=worker.config().get("identity") or worker.client.identity,
                            timeout_s=settings().worker_watch)
        watching = asyncio.ensure_future(watch.run())
        try:
            await super().run_worker(worker, next)
        finally:
            watching.cancel()
            with contextlib.suppress(BaseException):
                await watching
            evict_cached(worker)
