"""Worker and server CPU per rollout of one durable batch, with parts of the worker switched off.

    python benchmarks/bench_worker_cpu.py [--n 256] [--sleep 2] [--concurrency 64] [--repeats 2]
        [--variants base,no-owner,no-heartbeat,no-board,polls-10,polls-20,polls-10-half]
        [--against REV]

Each run is a fresh ``python`` process (so a variant's switch cannot leak into the next) on one
shared embedded server (a private ``ROLLOUTS_HOME``), and the variants are interleaved
``--repeats`` times, medians compared. A variant is an A/B of one per-rollout cost:

- ``base``: the worker as shipped (workflow activations on temporalio's thread pool);
- ``no-owner``: without the ``OwnerInterceptor`` (substrate owner labels; benchmark only);
- ``no-heartbeat``: the agent step's background heartbeat off (benchmark only);
- ``no-board``: without the live-progress board interceptor (benchmark only).

- ``polls-10``, ``polls-20``: 10 or 20 workflow-task polls instead of temporalio's 5 (the
  non-sticky queue, where every new Rollout's first workflow task waits, gets a fifth of them);
  ``polls-10-half``: 10 polls, half of them non-sticky.

``--against REV`` adds ``base@REV``: the same batch from a git worktree of an older commit (its
own copy of this script and of the package), interleaved with the others (e.g. ``--against
8faef9e``, the last release whose in-process Rollout was one merged agent step).

Prints wall, rollouts/s, CPU ms per rollout of the worker process (worker + client + the
in-process env) and of the dev server, and each variant's worker CPU against ``base``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import LETTERS, letter_tasks, private_home  # the script's own folder

VARIANTS = ("base", "no-owner", "no-heartbeat", "no-board", "polls-10", "polls-20", "polls-10-half")


def _switch_off(variant: str) -> None:
    """Apply one variant inside the run process (before the worker is built)."""
    from temporalio.worker import Interceptor

    import durable_rollouts.worker as worker

    if variant.startswith("polls-"):  # more workflow-task polls (and a larger non-sticky share)
        worker.WORKFLOW_TASK_POLLS = int(variant.split("-")[1])  # type: ignore[misc]
        if variant.endswith("-half"):
            worker.NONSTICKY_POLL_RATIO = 0.5  # type: ignore[misc]
    if variant == "no-owner":
        worker.OwnerInterceptor = Interceptor  # type: ignore[misc]
    if variant == "no-board":
        worker._Board = Interceptor  # type: ignore[misc]
    if variant == "no-heartbeat":
        from durable_rollouts.activities.rollout import RolloutActivities

        async def no_beat(self, step, details=None):  # type: ignore[no-untyped-def]
            return await step

        RolloutActivities.beating = no_beat  # type: ignore[method-assign]


async def _one(variant: str, n: int, sleep: float, concurrency: int) -> dict[str, float]:
    import psutil

    import durable_rollouts
    from durable_rollouts.paths import rollouts_home
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent, SleepAgent
    from durable_rollouts.sdk.taskset import Taskset

    _switch_off(variant)
    runtime = LocalRuntime(LETTERS)
    async with durable_rollouts.session():
        await Taskset("warm", letter_tasks(4)).run(FixedAgent(answer="2"), runtime=runtime)
        server = psutil.Process(int(json.loads((rollouts_home() / "temporal.json").read_text())["pid"]))

        def server_cpu() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in [server, *server.children(recursive=True)])

        s0, c0, t0 = server_cpu(), time.process_time(), time.monotonic()
        job = await Taskset("b", letter_tasks(n)).run(SleepAgent(seconds=sleep, answer="2"),
                                                      runtime=runtime, max_concurrent=concurrency)
        wall = time.monotonic() - t0
        cpu, scpu = time.process_time() - c0, server_cpu() - s0
    ok = sum(r.reward == 1.0 for r in job.runs)
    return {"wall": wall, "cpu_ms": cpu / n * 1000, "server_ms": scpu / n * 1000, "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--against", metavar="REV",
                        help="also run `base` from a git worktree of REV (an older commit), interleaved")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    args = parser.parse_args()
    if args.one:
        import asyncio

        print(json.dumps(asyncio.run(_one(args.one, args.n, args.sleep, args.concurrency))))
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    older = _worktree(args.against) if args.against else None
    if older is not None:
        variants.append(f"base@{args.against}")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with private_home():
        for _ in range(args.repeats):
            for variant in variants:
                script, env = __file__, None
                if older is not None and variant.startswith("base@"):  # that tree's script and code
                    script = str(older / "benchmarks" / "bench_worker_cpu.py")
                    env = {**os.environ, "PYTHONPATH": str(older)}
                out = subprocess.run(
                    [sys.executable, script, "--one", variant.split("@")[0], "--n", str(args.n),
                     "--sleep", str(args.sleep), "--concurrency", str(args.concurrency)],
                    capture_output=True, text=True, check=True, env=env)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs[variant].append(result)
                print(f"    {variant:13s} {result['wall']:5.1f} s  worker {result['cpu_ms']:5.1f} ms  "
                      f"server {result['server_ms']:5.1f} ms  ok {result['ok']:.0f}/{args.n}",
                      file=sys.stderr, flush=True)
    print(f"{args.n} rollouts of a {args.sleep:g} s agent at concurrency {args.concurrency}, "
          f"median of {args.repeats} (ranges in brackets):")
    base = statistics.median(r["cpu_ms"] for r in runs["base"]) if "base" in runs else None
    for variant, results in runs.items():
        def col(key: str) -> str:
            values = [r[key] for r in results]
            return f"{statistics.median(values):6.1f} [{min(values):.1f}-{max(values):.1f}]"

        versus = ""
        if base and variant != "base":
            versus = f"  worker cpu vs base {statistics.median(r['cpu_ms'] for r in results) / base:.2f}"
        print(f"  {variant:13s} wall s {col('wall')}  worker ms/rollout {col('cpu_ms')}  "
              f"server ms/rollout {col('server_ms')}{versus}")


def _worktree(rev: str) -> Path:
    """A detached git worktree of ``rev`` in a temporary folder (removed at exit)."""
    import atexit
    import tempfile

    from _common import ROOT

    path = Path(tempfile.mkdtemp(prefix="rollouts-against-"))
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise SystemExit(f"--against {rev}: git worktree add failed: {made.stderr.strip()}")
    atexit.register(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                    capture_output=True)
    return path


if __name__ == "__main__":
    main()
