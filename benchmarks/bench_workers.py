"""More workers, more throughput? N trivial rollouts with K ``rollouts worker`` processes on one server.

For each K in ``--workers`` (interleaved ``--repeats`` times, so drift on a busy box hits every K
alike) the script starts K real ``rollouts worker`` processes on a queue of their own, starts one
batch of ``--n`` trivial rollouts (``LocalRuntime`` letters env, a fixed answer) with no worker in
this process (K = 0: the batch's own in-process worker, as ``Taskset.run`` runs it), and reports
rollouts/s, the dev server's CPU per rollout and the workers' CPU per rollout, each against the
first K listed: throughput ratio and server CPU ratio. In-process
substrates of ``rollouts worker`` are pinned to the provisioning worker's own queue, so this is
where the cost of a pinned step shows.

    python benchmarks/bench_workers.py [--n 1000] [--workers 0,1,2,4] [--concurrency 256] [--repeats 2]

Runs against whatever ``durable_rollouts`` is importable (``PYTHONPATH=<an older checkout>``
measures that release with the same script: it uses public names only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from _common import LETTERS, letter_tasks, private_home


@dataclass
class Sample:
    k: int
    wall: float
    ok: int
    server_cpu: float
    worker_cpu: float


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _start_workers(k: int, address: str, queue: str, home: Path) -> list[subprocess.Popen[bytes]]:
    procs, logs = [], []
    for i in range(k):
        log = home / f"worker-{queue}-{i}.log"
        out = open(log, "wb")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "durable_rollouts.cli", "worker", "--temporal", address,
             "--task-queue", queue, "--gc-every", "0"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)))
        logs.append(log)
    deadline = time.monotonic() + 60
    while not all("ROLLOUTS_WORKER_READY" in log.read_text() for log in logs):
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            _stop(procs)
            raise SystemExit("a worker did not start:\n" + "\n".join(log.read_text()[-800:] for log in logs))
        time.sleep(0.2)
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


async def _one(k: int, n: int, concurrency: int, address: str, server: psutil.Process, home: Path,
               tag: str) -> Sample:
    """K = 0: the batch's own in-process worker (``Taskset.run``), the one-worker baseline."""
    from durable_rollouts import LocalRuntime, Taskset
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.temporal.batches import shutdown_embedded, start_job

    queue = f"bench-workers-{k}-{tag}"
    procs = _start_workers(k, address, queue, home)
    in_process = k == 0
    try:
        warm = await start_job(Taskset("warm", letter_tasks(2 * max(k, 1))), FixedAgent(answer="2"),
                               runtime=LocalRuntime(LETTERS), temporal=address, worker=in_process,
                               task_queue=queue, max_concurrent=2 * max(k, 1))
        await warm.wait()
        ps = [psutil.Process(p.pid) for p in procs] or [psutil.Process()]
        server0, workers0, t0 = _cpu(server), sum(_cpu(p) for p in ps), time.perf_counter()
        handle = await start_job(Taskset("workers", letter_tasks(n)), FixedAgent(answer="2"),
                                 runtime=LocalRuntime(LETTERS), temporal=address, worker=in_process,
                                 task_queue=queue, max_concurrent=concurrency)
        job = await handle.wait()
        wall = time.perf_counter() - t0
        server_cpu, worker_cpu = _cpu(server) - server0, sum(_cpu(p) for p in ps) - workers0
    finally:
        _stop(procs)
        if in_process:
            await shutdown_embedded()  # this process's worker: stopped, as the K workers are
    ok = sum(1 for r in job.runs if r.status == "succeeded")
    return Sample(k, wall, ok, server_cpu, worker_cpu)


async def main(n: int, ks: list[int], concurrency: int, repeats: int, home: Path) -> None:
    import json

    from durable_rollouts.temporal.connection import ensure_dev_server

    dev = await ensure_dev_server(home)
    address = dev.address
    server = psutil.Process(json.loads((home / "temporal.json").read_text())["pid"])
    samples: dict[int, list[Sample]] = {k: [] for k in ks}
    for rep in range(repeats):
        for k in ks:
            s = await _one(k, n, concurrency, address, server, home, f"{rep}")
            samples[k].append(s)
            print(f"repeat {rep + 1} K={k}: {n / s.wall:.1f} rollouts/s ({s.ok}/{n} ok), server "
                  f"{1000 * s.server_cpu / n:.1f} ms/rollout, workers {1000 * s.worker_cpu / n:.1f} ms/rollout",
                  flush=True)
    base = ks[0]

    def med(k: int, f) -> float:
        return statistics.median(f(s) for s in samples[k])

    def rng(k: int, f) -> str:
        vals = [f(s) for s in samples[k]]
        return f"[{min(vals):.1f}-{max(vals):.1f}]"

    print(f"\n{n} trivial rollouts at concurrency {concurrency}, {repeats} repeats (median [min-max])")
    for k in ks:
        rate = med(k, lambda s: n / s.wall)
        server_ms = med(k, lambda s: 1000 * s.server_cpu / n)
        print(f"K={k}: {rate:.1f} {rng(k, lambda s: n / s.wall)} rollouts/s; server "
              f"{server_ms:.1f} {rng(k, lambda s: 1000 * s.server_cpu / n)} ms/rollout; workers "
              f"{med(k, lambda s: 1000 * s.worker_cpu / n):.1f} ms/rollout; all ok: "
              f"{all(s.ok == n for s in samples[k])}")
    for k in ks[1:]:
        print(f"K={k}/K={base} throughput ratio {med(k, lambda s: n / s.wall) / med(base, lambda s: n / s.wall):.2f}; "
              f"server CPU ratio {med(k, lambda s: s.server_cpu) / med(base, lambda s: s.server_cpu):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--workers", default="0,1,2,4",
                        help="worker counts, comma-separated; 0 = the batch's own in-process worker")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    try:
        ks = [int(x) for x in args.workers.split(",") if x]
    except ValueError:
        parser.error("--workers: comma-separated integers, e.g. 1,2,4")
    if not ks or min(ks) < 0 or args.n < 1 or args.repeats < 1:
        parser.error("--workers must be 0 or more, --n and --repeats positive")
    with private_home() as home:
        asyncio.run(main(args.n, ks, args.concurrency, args.repeats, home))
