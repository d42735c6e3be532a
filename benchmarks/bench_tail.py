"""Rollouts with a heavy tail through continue-as-new: what a drain costs a batch.

``--n`` rollouts (``letters`` env, ``LocalRuntime``), most taking ``--fast`` seconds and every
``--every``-th ``--slow`` seconds, at ``--concurrency``, with the batch's history capped at
``--max-history-events`` so it continues as new several times. A batch that drains before each
continue-as-new idles its slots until its slowest rollout in flight ends; one whose rollouts
outlive its runs (``rollouts-outlive-runs``) does not. Prints wall per repeat, its range, and
the ideal (total agent time / concurrency). Run it at two commits to compare (a git worktree
of the older one, with ``PYTHONPATH`` pointing there).

    python benchmarks/bench_tail.py [--n 1000] [--concurrency 100] [--max-history-events 1000]
        [--fast 1] [--slow 20] [--every 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from _common import LETTERS, letter_tasks, private_home

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _tail_agent, for the worker


async def one(args: argparse.Namespace) -> float:
    from _tail_agent import TailAgent

    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.taskset import Taskset

    agent = TailAgent(fast=args.fast, slow=args.slow, every=args.every)
    start = time.monotonic()
    job = await Taskset("tail", letter_tasks(args.n)).run(
        agent, runtime=LocalRuntime(LETTERS), max_concurrent=args.concurrency,
        max_history_events=args.max_history_events)
    wall = time.monotonic() - start
    assert len(job.runs) == args.n and {r.status for r in job.runs} == {"succeeded"}, \
        {r.status for r in job.runs}
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--max-history-events", type=int, default=1000)
    parser.add_argument("--fast", type=float, default=1.0)
    parser.add_argument("--slow", type=float, default=20.0)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    slow = len(range(0, args.n, args.every))
    ideal = ((args.n - slow) * args.fast + slow * args.slow) / args.concurrency
    walls = []
    for repeat in range(args.repeats):
        with private_home():  # a fresh embedded server each time: no drift from a growing db
            walls.append(asyncio.run(one(args)))
        print(f"repeat {repeat + 1}: wall {walls[-1]:.1f} s ({walls[-1] / ideal:.2f} x ideal)", flush=True)
    print(f"{args.n} rollouts ({slow} of {args.slow:g} s, the rest {args.fast:g} s) at concurrency "
          f"{args.concurrency}, history capped at {args.max_history_events} events: wall "
          f"{min(walls):.1f}-{max(walls):.1f} s, ideal {ideal:.1f} s", flush=True)


if __name__ == "__main__":
    main()
