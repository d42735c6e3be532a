"""Load: ``--rollouts`` (500) concurrent rollouts with ``--seconds`` (5 s) sleeping agents on ONE
worker process.

    python benchmarks/load.py [--rollouts 500] [--seconds 5]

Starts a dev server (the Temporal tests' ``DevServer``) and one ``python -m
durable_rollouts.worker`` process (``max_concurrent_activities`` 500), runs one batch of echo
rollouts of ``tests/temporal/counting_env.py`` on ``LocalRuntime`` (the envs live inside the
worker, so the worker really is the only process doing the work) and reports:

- wall time of the batch and results by status;
- heartbeat timeouts: activity attempts > 1 and ActivityTaskTimedOut events in the histories of
  every Rollout workflow (read back from the server);
- activity slot exhaustion: schedule-to-start latency of the agent activities (a full slot pool
  shows up as activities waiting to start) and the peak number of agents running at once
  (from the agents' own log);
- worker CPU (utime+stime from /proc/<pid>/stat, over the batch) and peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from _common import proc_status, with_test_helpers

with_test_helpers("temporal")
ROOT = Path(__file__).resolve().parent.parent
os.environ["ROLLOUTS_HOME"] = tempfile.mkdtemp(prefix="rollouts-load-")
os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")

from temporal_helpers import ENV_FILE, CountingAgent, DevServer, WorkerProcess

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def main_async(args: argparse.Namespace) -> None:
    from temporalio.api.enums.v1 import EventType

    from durable_rollouts.models import Task
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import start_job
    from durable_rollouts.temporal.connection import connect_client

    work = Path(os.environ["ROLLOUTS_HOME"])
    server = DevServer(work / "temporal.db")
    server.start()
    queue = f"load-{uuid.uuid4().hex[:8]}"
    worker = None
    try:
        client = await connect_client(server.address)
        worker = WorkerProcess(server.address, queue)
        pid = worker.pid
        agents = work / "agents.log"
        rows = [Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x", "tag": str(i)})
                for i in range(args.rollouts)]
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        rss_samples: list[int] = []
        handle = await start_job(Taskset("load", rows), CountingAgent(answer="x", seconds=args.seconds,
                                                                      log=str(agents)),
                                 runtime=LocalRuntime(ENV_FILE), temporal=client, worker=False,
                                 task_queue=queue, max_concurrent=args.rollouts)
        waiter = asyncio.ensure_future(handle.wait())
        while not waiter.done():
            rss_samples.append(proc_status(pid).get("VmRSS", 0))
            await asyncio.wait({waiter}, timeout=0.5)
        job = waiter.result()
        wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
        hwm = proc_status(pid).get("VmHWM", 0)
        statuses: dict[str, int] = {}
        for run in job.runs:
            statuses[run.status] = statuses.get(run.status, 0) + 1
        rewards = sum(1 for r in job.runs if r.reward == 1.0)

        # histories: retries, timeouts, schedule-to-start of the agent activity
        retried = timed_out = 0
        s2s: list[float] = []
        intervals: list[tuple[float, float]] = []
        sem = asyncio.Semaphore(20)

        async def inspect(rollout_id: str) -> None:
            nonlocal retried, timed_out
            async with sem:
                history = await client.get_workflow_handle(rollout_id).fetch_history()
            scheduled: dict[int, float] = {}
            started: dict[int, float] = {}
            for ev in history.events:
                at = ev.event_time.ToDatetime().timestamp()
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    if ev.activity_task_scheduled_event_attributes.activity_type.name == "rollouts.agent":
                        scheduled[ev.event_id] = at
                elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    a = ev.activity_task_started_event_attributes
                    if a.attempt > 1:
                        retried += 1
                    if a.scheduled_event_id in scheduled:
                        s2s.append(at - scheduled[a.scheduled_event_id])
                        started[a.scheduled_event_id] = at
                elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    sid = ev.activity_task_completed_event_attributes.scheduled_event_id
                    if sid in started:
                        intervals.append((started[sid], at))
                elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                    timed_out += 1

        await asyncio.gather(*(inspect(r.rollout_id) for r in job.runs))

        # peak number of agent activities running at once (sweep over started..completed)
        edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        starts = len(agents.read_text().splitlines()) if agents.exists() else 0
        print(f"rollouts: {args.rollouts} x {args.seconds}s agents on ONE worker process (pid {pid})")
        print(f"batch wall: {wall:.1f}s  statuses: {statuses}  reward 1.0: {rewards}")
        print(f"agent starts: {starts} (>{args.rollouts} means agent retries)")
        print(f"activity attempts > 1: {retried}  ActivityTaskTimedOut events: {timed_out}")
        print(f"agent activity schedule-to-start: p50 {pct(s2s, 0.5):.2f}s  p95 {pct(s2s, 0.95):.2f}s  "
              f"max {max(s2s) if s2s else 0:.2f}s  (n={len(s2s)})")
        print(f"peak agent activities running at once: {peak} (slots: 500 per queue)")
        print(f"worker CPU: {cpu:.1f}s over {wall:.1f}s = {100 * cpu / wall:.0f}% of one core")
        print(f"worker RSS: peak (VmHWM) {hwm / 1024:.0f} MB; sampled max {max(rss_samples or [0]) / 1024:.0f} MB")
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
