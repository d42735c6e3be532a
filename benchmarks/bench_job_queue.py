"""Does a job's own queue cost anything? ``Taskset.run`` on its default queue (``rollouts-job-<id>``,
a new queue on the server per job) against the same process reusing one chosen queue for all its
jobs (``task_queue=``), interleaved on one embedded server.

Each repeat and mode: ``--samples`` one-rollout batches (latency, start to Job), then ``--n``
rollouts of a ``--sleep`` s agent at ``--concurrency``: wall, this process's CPU (worker + client)
and the dev server's CPU per rollout. Both modes start an in-process worker per job; only the
queue differs.

    python benchmarks/bench_job_queue.py [--n 256] [--sleep 2] [--concurrency 64] [--samples 8]
        [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import psutil
from _common import LETTERS, letter_tasks, private_home

MODES = {"job": None, "fixed": "rollouts-bench-fixed"}


def _tree_cpu(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.paths import rollouts_home
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent, SleepAgent
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import shutdown_embedded

    runtime = LocalRuntime(LETTERS)
    await Taskset("warm", letter_tasks(2)).run(FixedAgent(answer="2"), runtime=runtime)
    server = int(json.loads((rollouts_home() / "temporal.json").read_text())["pid"])
    me = psutil.Process()
    rows: dict[str, dict[str, list[float]]] = {m: {"lat": [], "wall": [], "cpu": [], "srv": []} for m in MODES}
    for rep in range(args.repeats):
        for mode, queue in MODES.items():
            row = rows[mode]
            for i in range(args.samples):
                t0 = time.perf_counter()
                await Taskset(f"one{i}", letter_tasks(1)).run(FixedAgent(answer="2"), runtime=runtime,
                                                             task_queue=queue)
                row["lat"].append(time.perf_counter() - t0)
            cpu0, srv0, t0 = sum(me.cpu_times()[:2]), _tree_cpu(server), time.perf_counter()
            job = await Taskset(f"b{rep}{mode}", letter_tasks(args.n)).run(
                SleepAgent(seconds=args.sleep, answer="2"), runtime=runtime,
                max_concurrent=args.concurrency, task_queue=queue)
            row["wall"].append(time.perf_counter() - t0)
            row["cpu"].append((sum(me.cpu_times()[:2]) - cpu0) / args.n * 1000)
            row["srv"].append((_tree_cpu(server) - srv0) / args.n * 1000)
            ok = sum(r.reward == 1.0 for r in job.runs)
            print(f"  {mode:5s} wall {row['wall'][-1]:5.1f} s  ok {ok}/{args.n}  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    print(f"{args.n} x {args.sleep:g} s agents at c{args.concurrency}, {args.repeats} repeats "
          f"(every value listed); latency: median of {args.samples * args.repeats} one-rollout batches")
    for mode, row in rows.items():
        fmt = {k: ", ".join(f"{v:.1f}" for v in vals) for k, vals in row.items()}
        print(f"  {mode:5s} latency p50 {statistics.median(row['lat']) * 1000:.0f} ms  wall s [{fmt['wall']}]  "
              f"worker+client ms/rollout [{fmt['cpu']}]  server ms/rollout [{fmt['srv']}]")
    await shutdown_embedded()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    with private_home():
        asyncio.run(main(parser.parse_args()))
