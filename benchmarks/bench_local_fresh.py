"""What LocalRuntime's per-rollout Environment costs: a fresh load of ``env.py`` and its own
server per rollout (the default) against one shared server (``shared=True``).

Both through ``run_direct`` (no Temporal: the difference is the load, the hooks and the server),
``--n`` rollouts of ``examples/letters`` at ``--concurrency``, an instant agent, interleaved
``--repeats`` times; prints each median wall, the added ms per rollout and the ratio.

    python benchmarks/bench_local_fresh.py [--n 512] [--concurrency 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _common import LETTERS, letter_tasks


async def one(n: int, concurrency: int, shared: bool) -> float:
    from durable_rollouts import LocalRuntime, Taskset
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.sdk.direct import run_direct

    taskset = Taskset("bench", letter_tasks(n))
    began = time.perf_counter()
    job = await run_direct(taskset, FixedAgent(answer="2"), LocalRuntime(LETTERS, shared=shared),
                           max_concurrent=concurrency)
    wall = time.perf_counter() - began
    assert all(r.status == "succeeded" for r in job.runs), [r.error for r in job.runs][:3]
    return wall


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    await one(8, 8, False)  # warm: imports
    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for shared in (True, False):
            walls[shared].append(await one(args.n, args.concurrency, shared))
    shared, fresh = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"{args.n} rollouts at c{args.concurrency}, median of {args.repeats}")
    print(f"shared=True  {shared:.2f} s  {walls[True]}")
    print(f"per rollout  {fresh:.2f} s  {walls[False]}")
    print(f"added per rollout {1000 * (fresh - shared) / args.n:.2f} ms (wall / n)")
    print(f"per-rollout/shared throughput ratio {shared / fresh:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
