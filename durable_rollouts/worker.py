"""Build and run the Temporal worker: every workflow and activity, listed explicitly, once.

``worker_parts(queues)`` is the one list of what a worker of this package registers (workflows,
activities, interceptors); ``build_worker`` and ``temporal.plugin.RolloutsPlugin`` both use it, and
both run on a client with ``temporal.codec.data_converter()``.

``build_worker(client, task_queue=..., host_queue=..., process_queue=...)`` returns a
``RolloutWorker`` polling the shared queue (workflows + activities) and, when different, this
host's and this process's queues (activities of host-/process-local substrates), each with a
liveness queue beside it (``liveness_worker``: a busy queue is not a lost one). Run it with
``await worker.run()`` or ``async with worker:``. ``python -m durable_rollouts.worker --temporal
HOST:PORT [--task-queue Q] [--host-queue auto|NAME] [--gc-every SECONDS] [--max-concurrent N]``
runs one as its own process (crash tests SIGKILL these); SIGTERM/SIGINT shut it down gracefully.
With ``gc_every_s`` the worker also runs ``durable_rollouts.gc.sweep`` in the background (default 300 s for worker processes, off
for workers built in-process): substrates whose rollout is over are removed without ``rollouts gc``.
A workflow interceptor posts every Rollout child's start and result to the in-process progress
board (``sdk.board``), which ``rollouts run`` reads instead of querying the batch workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Self

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    PollerBehaviorSimpleMaximum,
    Worker,
    WorkerTuner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from durable_rollouts.activities import Queues, RolloutActivities, TasksetActivities
from durable_rollouts.activities.admission import AdmissionActivities
from durable_rollouts.activities.liveness import LIVENESS_SLOTS, queue_alive
from durable_rollouts.activities.owner import OwnerInterceptor
from durable_rollouts.activities.stream_pages import StreamPageActivities
from durable_rollouts.activities.watch import RunningAgents, WatchActivities
from durable_rollouts.capacity import DEFAULT_SLOTS, check_capacity, register_slots, slots_for
from durable_rollouts.errors import ConfigError
from durable_rollouts.ids import batch_of
from durable_rollouts.malloc import keep_trimmed
from durable_rollouts.release import worker_identity
from durable_rollouts.settings import WORKER_READY, Settings, settings, var
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.temporal.board import BOARD
from durable_rollouts.temporal.eviction import evict_cached
from durable_rollouts.temporal.storage import storage_url
from durable_rollouts.temporal.stream_pages import StreamStore
from durable_rollouts.temporal.watch import WatchRunner
from durable_rollouts.workflows import Rollout, TasksetRun
from durable_rollouts.workflows.admission import AdmissionWorkflow
from durable_rollouts.workflows.queue_probe import alive_queue
from durable_rollouts.workflows.types import DEFAULT_TASK_QUEUE
from durable_rollouts.workflows.worker_watch import WorkerWatch

__all__ = ["DEFAULT_GC_EVERY_S", "RolloutWorker", "WorkerParts", "build_worker", "host_queue_name",
           "liveness_worker", "main", "process_queue_name", "run_worker", "worker_parts"]

log = logging.getLogger(__name__)

DEFAULT_GC_EVERY_S: float = Settings.model_fields["gc_every"].default  # 0 disables the sweep
GC_EVERY_ENV = var("gc_every")

WORKFLOWS = [TasksetRun, Rollout, AdmissionWorkflow, WorkerWatch]
# Heartbeats reach the server once per 80% of the step's heartbeat timeout (temporalio's
# throttle), at most this far apart: the agent step's 20 s gives one per 16 s. Steps with no
# heartbeat timeout that beat anyway send one per HEARTBEAT_THROTTLE_DEFAULT.
HEARTBEAT_THROTTLE = timedelta(seconds=60)
HEARTBEAT_THROTTLE_DEFAULT = timedelta(seconds=2)
# Workflow-task polls: temporalio's default is 5, of which the non-sticky queue, where every new
# Rollout's first task waits, gets 5 x 0.2 = 1.
WORKFLOW_TASK_POLLS = 5
# Sticky workflow cache: temporalio's default 1,000, or every in-flight Rollout plus its batches;
# an evicted Rollout replays its whole history on its next task (CPU per waiting rollout).
DEFAULT_CACHED_WORKFLOWS = 1000
SLOT_CACHE_MARGIN = 100
NONSTICKY_POLL_RATIO = 0.2


def host_queue_name(task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    return f"{task_queue}@{socket.gethostname()}"


def process_queue_name(task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    return f"{task_queue}@{socket.gethostname()}:{os.getpid()}"


class _BoardInbound(WorkflowInboundInterceptor):
    """Posts Rollout starts/results to the in-process ``BOARD`` (no commands: replay-safe)."""

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        info = workflow.info()
        if info.workflow_type == "TasksetRun":
            result = await super().execute_workflow(input)  # continue-as-new raises: keep counting
            if batch_of(info.workflow_id) == info.workflow_id:  # a part's rollouts count for its batch
                BOARD.close(info.workflow_id)
            return result
        batch = batch_of(info.parent.workflow_id) if info.parent is not None else None
        if info.workflow_type != "Rollout" or batch is None:
            return await super().execute_workflow(input)
        # A replay posts nothing: what it replays was posted when it ran (here, or in a process
        # whose board this one never saw), and a finished rollout replayed to answer a query
        # would otherwise count again once the board forgot its id.
        if not workflow.unsafe.is_replaying():
            BOARD.started(batch, info.workflow_id)
        try:
            result = await super().execute_workflow(input)
        except asyncio.CancelledError:  # the parent counts it cancelled too (eviction is no such error)
            if not workflow.unsafe.is_replaying():
                BOARD.finished(batch, info.workflow_id, "cancelled", None)
            raise
        if not workflow.unsafe.is_replaying():
            BOARD.finished(batch, info.workflow_id, getattr(result, "status", ""),
                           getattr(result, "reward", None))
        return result


class _Board(Interceptor):
    def workflow_interceptor_class(
            self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _BoardInbound


class RolloutWorker:
    """One or more temporalio Workers (shared queue + this host's/process's queues), plus the
    orphan sweep every ``gc_every_s`` seconds while they run (0 = none)."""

    def __init__(self, workers: list[Worker], queues: Queues, *, gc_every_s: float = 0.0,
                 slots: int = DEFAULT_SLOTS, watch: WatchRunner | None = None) -> None:
        self.workers = workers
        self.watch = watch  # this process's liveness watch (``temporal.watch``)
        self.queues = queues
        self.slots = slots  # activity slots per queue: rollouts it holds in flight at once
        self.gc_every_s = gc_every_s
        self._task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        keep_trimmed(settings().malloc_trim)
        BOARD.workers += 1
        sweeper = None
        if self.gc_every_s > 0:
            from durable_rollouts.gc import sweep

            sweeper = asyncio.ensure_future(sweep(self.workers[0].client, self.gc_every_s))
        watching = asyncio.ensure_future(self.watch.run()) if self.watch is not None else None
        try:
            await asyncio.gather(*(w.run() for w in self.workers))
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(BaseException):
                    await watching
            for w in self.workers:  # no suspended run may be left for the garbage collector
                evict_cached(w)
            BOARD.workers -= 1
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper

    async def shutdown(self) -> None:
        if self.watch is not None:  # cancel the watch first: a worker shutting down is not lost
            await self.watch.stop()
        await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task

    async def __aenter__(self) -> Self:
        self._task = asyncio.ensure_future(self.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


@dataclass(frozen=True)
class WorkerParts:
    """What a worker of this package registers, for the queues it polls."""

    workflows: list[type]  # on the shared queue
    activities: list[Callable[..., Any]]  # on the shared queue: every step and taskset activity
    step_activities: list[Callable[..., Any]]  # on a host's / process's own queue: the steps
    interceptors: list[Interceptor]  # outermost first, on every queue


def worker_parts(queues: Queues, *, trace_store: TraceStore | None = None,
                 interceptors: Sequence[Interceptor] = (),
                 running: RunningAgents | None = None) -> WorkerParts:
    """The one list of workflows, activities and interceptors of a durable-rollouts worker.

    ``interceptors`` (e.g. the test suite's fault injection) run outside the package's own: the
    ``OwnerInterceptor`` (substrate owner labels for gc) and the progress-board interceptor.
    ``running`` is where the agent steps list themselves for this process's watch.
    """
    running = RunningAgents() if running is None else running
    rollout = RolloutActivities(queues, trace_store=trace_store, running=running)
    return WorkerParts(
        workflows=list(WORKFLOWS),
        activities=[*rollout.all(), *TasksetActivities().all(), *AdmissionActivities().all(),
                    *StreamPageActivities(StreamStore).all(), WatchActivities(running).agents_on],
        step_activities=rollout.all(),
        interceptors=[*interceptors, OwnerInterceptor(), _Board()],
    )


def build_worker(client: Client, *, task_queue: str = DEFAULT_TASK_QUEUE, host_queue: str | None = None,
                 process_queue: str | None = None, max_concurrent_activities: int = DEFAULT_SLOTS,
                 max_concurrent_workflow_tasks: int | None = None, trace_store: TraceStore | None = None,
                 sandbox: bool | None = None, identity: str | None = None,
                 graceful_shutdown_s: float = 5.0, gc_every_s: float = 0.0,
                 interceptors: Sequence[Interceptor] = (), tuner: WorkerTuner | None = None) -> RolloutWorker:
    """Build (not start) the worker for ``client``.

    Args:
        client: a client made with the pydantic data converter (``temporal.connection.connect_client``).
        task_queue: the shared queue (workflows and global-locality steps).
        host_queue: this host's queue for host-local substrates; None = ``task_queue``
            (single-host mode, which keeps eager activity dispatch); ``"auto"`` = ``<queue>@<host>``.
        process_queue: this process's queue for in-process substrates; None = ``host_queue``;
            ``"auto"`` = ``<queue>@<host>:<pid>``.
        max_concurrent_activities: activity slots per polled queue (agents mostly wait on I/O);
            ``capacity.slots_for(max_concurrent)`` for a worker that holds that many rollouts.
            Also sizes the workflow cache, so every in-flight Rollout stays cached. A number the
            process's file-descriptor limit or memory cannot hold is warned about
            (``capacity.check_capacity``).
        sandbox: run workflows in temporalio's sandbox or unsandboxed (faster); None reads
            ``ROLLOUTS_WORKFLOW_SANDBOX`` (default off: these workflows import only pure models,
            and the purity and replay tests guard them; the sandbox costs ~30% worker CPU).
        identity: the Temporal worker identity; default ``durable-rollouts <version> (<commit>)
            <pid>@<host>``, so a failed workflow task (e.g. non-determinism) names the release.
        gc_every_s: remove orphaned substrates every this many seconds while running, asking
            ``client`` about their workflows (``durable_rollouts.gc.sweep``); 0 = never.
        interceptors: extra temporalio worker interceptors (outermost first), e.g. the test
            suite's fault injection; the worker's own ``OwnerInterceptor`` runs inside them.
        tuner: a temporalio ``WorkerTuner`` instead of the fixed slot counts (e.g. the
            resource-based one, compared in ``benchmarks/bench_width.py --tuner resource``; the
            fixed slots sized from max_concurrent hold a wide batch sooner: see README Limits).
    """
    if host_queue == "auto":
        host_queue = host_queue_name(task_queue)
    if process_queue == "auto":
        process_queue = process_queue_name(task_queue)
    if sandbox is None:
        sandbox = settings().workflow_sandbox
    queues = Queues(shared=task_queue, host=host_queue, process=process_queue)
    check_capacity(max_concurrent_activities)
    register_slots(max_concurrent_activities)
    running = RunningAgents()
    parts = worker_parts(queues, trace_store=trace_store, interceptors=interceptors, running=running)
    runner = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("durable_rollouts"))
    slot_options: dict[str, Any] = {"tuner": tuner} if tuner is not None else {
        "max_concurrent_activities": max_concurrent_activities,
        "max_concurrent_local_activities": max_concurrent_activities,
    }
    common: dict[str, Any] = {
        **slot_options,
        "max_heartbeat_throttle_interval": HEARTBEAT_THROTTLE,
        "default_heartbeat_throttle_interval": HEARTBEAT_THROTTLE_DEFAULT,
        "graceful_shutdown_timeout": timedelta(seconds=graceful_shutdown_s),
        "identity": identity or worker_identity(),  # names the release in every task it fails
        "interceptors": parts.interceptors,
    }
    workers = [Worker(
        client, task_queue=task_queue, workflows=parts.workflows, activities=parts.activities,
        workflow_runner=runner if sandbox else _unsandboxed(),
        **({} if tuner is not None else {"max_concurrent_workflow_tasks": max_concurrent_workflow_tasks}),
        max_cached_workflows=max(DEFAULT_CACHED_WORKFLOWS, max_concurrent_activities + SLOT_CACHE_MARGIN),
        workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=WORKFLOW_TASK_POLLS),
        nonsticky_to_sticky_poll_ratio=NONSTICKY_POLL_RATIO,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings().sticky_timeout),
        **common,
    )]
    for queue in queues.extra:
        workers.append(Worker(client, task_queue=queue, activities=parts.step_activities, **common))
        workers.append(liveness_worker(client, queue, identity=common["identity"]))
    watch = WatchRunner(client, task_queue=task_queue, sentinel=WatchActivities(running),
                        identity=common["identity"], timeout_s=settings().worker_watch)
    return RolloutWorker(workers, queues, gc_every_s=gc_every_s, slots=max_concurrent_activities,
                         watch=watch)


def liveness_worker(client: Client, queue: str, *, identity: str) -> Worker:
    """Answers liveness probes for ``queue`` (``workflows.queue_probe``) with its own poller and
    slots, so a worker whose step slots on ``queue`` are all taken still shows it is alive."""
    return Worker(client, task_queue=alive_queue(queue), activities=[queue_alive],
                  max_concurrent_activities=LIVENESS_SLOTS,
                  activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=1),
                  graceful_shutdown_timeout=timedelta(seconds=1), identity=identity)


def _unsandboxed() -> Any:
    from temporalio.worker import UnsandboxedWorkflowRunner

    return UnsandboxedWorkflowRunner()


async def run_worker(address: str | None = None, *, task_queue: str = DEFAULT_TASK_QUEUE,
                     host_queue: str | None = None, process_queue: str | None = "auto",
                     max_concurrent_activities: int = DEFAULT_SLOTS, stop: asyncio.Event | None = None,
                     gc_every_s: float = DEFAULT_GC_EVERY_S,
                     interceptors: Sequence[Interceptor] = ()) -> None:
    """Connect and run a worker until ``stop`` is set or SIGTERM/SIGINT arrives."""
    from durable_rollouts.temporal.connection import connect_client

    client = await connect_client(address)
    worker = build_worker(client, task_queue=task_queue, host_queue=host_queue,
                          process_queue=process_queue, max_concurrent_activities=max_concurrent_activities,
                          gc_every_s=gc_every_s, interceptors=interceptors)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with worker:
        log.info("worker polling %s (+%s)", task_queue, ", ".join(worker.queues.extra) or "no extra queues")
        log.info("storage %s", storage_url())
        print(f"{WORKER_READY} queue={task_queue}", flush=True)
        await stop.wait()


def gc_every(value: str) -> float:
    """``--gc-every`` / ``$ROLLOUTS_GC_EVERY``: seconds >= 0 (0 disables the sweep)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0 disables it), got {value!r}")
    return seconds


def main(argv: list[str] | None = None, *, interceptors: Sequence[Interceptor] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m durable_rollouts.worker")
    parser.add_argument("--temporal", default=None, help="HOST:PORT (default: embedded dev server)")
    parser.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    parser.add_argument("--host-queue", default=None, help="'auto' = <queue>@<hostname>")
    parser.add_argument("--process-queue", default="auto", help="'auto' = <queue>@<host>:<pid>")
    parser.add_argument("--max-concurrent-activities", type=int, default=None,
                        help=f"activity slots per queue (default {DEFAULT_SLOTS}, or sized by --max-concurrent)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="rollouts this worker holds in flight (sizes its slots)")
    parser.add_argument("--gc-every", type=gc_every, metavar="SECONDS", default=None,
                        help=f"remove orphaned substrates every SECONDS (0 = never; default "
                             f"${GC_EVERY_ENV}, else {DEFAULT_GC_EVERY_S:g})")
    args = parser.parse_args(argv)
    try:
        config = settings()
    except ConfigError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=config.log_level or "WARNING")
    asyncio.run(run_worker(args.temporal, task_queue=args.task_queue, host_queue=args.host_queue,
                           process_queue=args.process_queue,
                           max_concurrent_activities=args.max_concurrent_activities
                           or slots_for(args.max_concurrent),
                           gc_every_s=config.gc_every if args.gc_every is None else args.gc_every,
                           interceptors=interceptors))


if __name__ == "__main__":
    main()
