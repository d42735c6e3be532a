"""Scale: N trivial rollouts through the durable path (embedded server + in-process worker).

Reports wall time, rollouts/s, the worker's peak RSS (this process), CPU per rollout of this
process (worker + client) and of the dev server (which one is the limit on a small box), and the
longest history of any workflow run (TasksetRun runs after continue-as-new, and Rollout children).

    python benchmarks/bench_scale.py --n 10000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import psutil

from _common import LETTERS, letter_tasks, peak_rss_mb, private_home


async def main(n: int, concurrency: int, sample: int) -> None:
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.temporal.batches import _client, start_job
    from durable_rollouts.sdk.providers import LocalRuntime
    from durable_rollouts.sdk.taskset import Taskset

    from durable_rollouts.sdk.paths import rollouts_home

    taskset = Taskset("scale", letter_tasks(n))
    await _client(None)  # the embedded server is up from here on
    server = psutil.Process(json.loads((rollouts_home() / "temporal.json").read_text())["pid"])
    me = psutil.Process()
    cpu0, server0 = _cpu(me), _cpu(server)
    t0 = time.perf_counter()
    handle = await start_job(taskset, FixedAgent(answer="2"), runtime=LocalRuntime(LETTERS),
                             max_concurrent=concurrency)
    job = await handle.wait()
    wall = time.perf_counter() - t0
    cpu, server_cpu = _cpu(me) - cpu0, _cpu(server) - server0
    rss = peak_rss_mb()
    client, _ = await _client(None)
    parent_max, child_max, runs = 0, 0, 0
    async for wf in client.list_workflows(f'RolloutsJobId = "{job.id}"'):
        if wf.workflow_type == "TasksetRun":
            runs += 1
            parent_max = max(parent_max, wf.history_length)
        elif sample > 0:
            sample -= 1
            child_max = max(child_max, wf.history_length)
    counts = job.status_counts()
    print(f"rollouts            {n} (concurrency {concurrency})")
    print(f"statuses            {counts}")
    print(f"wall time           {wall:.1f} s")
    print(f"throughput          {n / wall:.1f} rollouts/s")
    print(f"peak RSS (worker+client, one process) {rss:.0f} MiB")
    print(f"CPU per rollout     worker+client {cpu / n * 1000:.1f} ms, server {server_cpu / n * 1000:.1f} ms "
          f"({(cpu + server_cpu) / wall:.2f} cores busy on average)")
    print(f"TasksetRun runs     {runs} (continue-as-new {runs - 1}x); max history {parent_max} events")
    print(f"Rollout history     max {child_max} events (sampled children)")


async def session_main(n: int, concurrency: int, sample: int) -> None:
    """``main`` in one ``session()``: the in-process worker stops at the end even on an error
    (one left to ``asyncio.run``'s final cancellation would hang the process)."""
    from durable_rollouts.sdk.lifetime import session

    async with session():
        await main(n, concurrency, sample)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--sample", type=int, default=200, help="children whose history to check")
    args = parser.parse_args()
    with private_home():
        asyncio.run(session_main(args.n, args.concurrency, args.sample))
