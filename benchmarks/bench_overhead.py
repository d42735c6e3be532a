"""Durable vs direct on the same env and agent, in one run; prints both and the ratio.

1. Latency at concurrency 1: ``--samples`` one-rollout batches, end to end (start to Job), with
   ``run_taskset`` (embedded server + in-process worker) and with ``run_direct``; p50/p90 and the
   added p50 latency.
2. Throughput at concurrency 64: ``--n`` rollouts of a ``--sleep`` s sleep agent, both paths;
   rollouts/s and durable/direct.

    python benchmarks/bench_overhead.py [--samples 20] [--n 256] [--sleep 2] [--storage file|moto|URL]

``--storage`` picks ROLLOUTS_STORAGE for both paths (the direct executor writes its traces there
too); the bytes kept in storage per durable rollout are printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import LETTERS, letter_tasks, percentile, private_home
from _storage import add_storage_option, storage_bytes, use_storage


async def main(samples: int, n: int, sleep: float, concurrency: int, storage: str) -> None:
    from durable_rollouts.sdk.agents import FixedAgent, SleepAgent
    from durable_rollouts.sdk.direct import run_direct
    from durable_rollouts.sdk.orchestrate import run_taskset, shutdown_embedded
    from durable_rollouts.sdk.providers import LocalRuntime
    from durable_rollouts.sdk.taskset import Taskset

    runtime = LocalRuntime(LETTERS)
    agent = FixedAgent(answer="2")
    warm = Taskset("warm", letter_tasks(2))
    await run_taskset(warm, agent, runtime=runtime)  # server, worker, env import: not measured
    await run_direct(warm, agent, runtime)

    durable, direct = [], []
    for i in range(samples):
        one = Taskset(f"one{i}", letter_tasks(1))
        t0 = time.perf_counter()
        job = await run_taskset(one, agent, runtime=runtime)
        durable.append(time.perf_counter() - t0)
        assert job.runs[0].reward == 1.0, job.runs[0].error
        t0 = time.perf_counter()
        await run_direct(one, agent, runtime)
        direct.append(time.perf_counter() - t0)
    d50, x50 = percentile(durable, 0.5) * 1000, percentile(direct, 0.5) * 1000
    print(f"concurrency 1, {samples} one-rollout batches (end to end):")
    print(f"  durable p50 {d50:.0f} ms  p90 {percentile(durable, 0.9) * 1000:.0f} ms")
    print(f"  direct  p50 {x50:.0f} ms  p90 {percentile(direct, 0.9) * 1000:.0f} ms")
    print(f"  added p50 latency {d50 - x50:.0f} ms")

    tasks = Taskset("many", letter_tasks(n))
    sleeper = SleepAgent(seconds=sleep, answer="2")
    objects0, stored0 = storage_bytes(storage)
    t0 = time.perf_counter()
    job = await run_taskset(tasks, sleeper, runtime=runtime, max_concurrent=concurrency)
    t_durable = time.perf_counter() - t0
    objects1, stored1 = storage_bytes(storage)
    ok = sum(r.reward == 1.0 for r in job.runs)
    t0 = time.perf_counter()
    djob = await run_direct(tasks, sleeper, runtime, max_concurrent=concurrency)
    t_direct = time.perf_counter() - t0
    dok = sum(r.reward == 1.0 for r in djob.runs)
    ideal = n / concurrency * sleep
    print(f"concurrency {concurrency}, {n} rollouts of a {sleep:g} s agent (ideal {ideal:.1f} s):")
    print(f"  durable {t_durable:.1f} s = {n / t_durable:.1f} rollouts/s ({ok}/{n} rewarded)")
    print(f"  direct  {t_direct:.1f} s = {n / t_direct:.1f} rollouts/s ({dok}/{n} rewarded)")
    print(f"  durable/direct throughput ratio {t_direct / t_durable:.2f}")
    print(f"storage {storage}: {(stored1 - stored0) / n:.0f} B/rollout in "
          f"{objects1 - objects0} objects (durable batch)")
    await shutdown_embedded()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    add_storage_option(parser)
    args = parser.parse_args()
    with private_home() as home, use_storage(args.storage, home) as url:
        asyncio.run(main(args.samples, args.n, args.sleep, args.concurrency, url))
