"""Orchestration overhead, every path in one run on one server: direct, plain temporalio, ours.

1. Latency at concurrency 1: ``--samples`` one-rollout batches end to end (start to Job) with
   ``Taskset.run`` (embedded server + in-process worker) and with ``run_direct``: p50/p90 and the
   added p50 latency.
2. Throughput: ``--n`` rollouts of a ``--sleep`` s sleep agent at ``--concurrency``, through
   ``direct`` (``sdk.direct.run_direct``), ``plain`` (temporalio only: one parent workflow, one
   child per rollout, one sleeping activity each; ``_plain.py``), ``plain-sa`` (the same child
   with the search attributes, summary and final upsert every Rollout has), ``plain-6steps`` (the
   same child with the card's six steps, five of them no-op local activities: the fair baseline of
   the step shape), ``plain-6steps-sa`` (six steps and the search attributes: everything a Rollout
   records, with no work in any step), ``durable`` (``Taskset.run``),
   ``cli`` (``rollouts run`` as a subprocess on a pseudo-terminal, so its live progress bar really
   renders) and ``cli-json`` (``rollouts run --json``, stderr not a terminal: no bar). The paths
   are interleaved ``--repeats`` times (drift on a busy box hits every path alike) and the medians
   are compared. CPU per rollout: this process (worker + client, or the CLI subprocess tree) and
   the dev server (psutil).
3. ``--group-rows``: ``--n`` distinct rows vs one row with group ``--n`` (durable and direct).
4. ``--long``: 30 s agents, 128 rollouts, concurrency 64 (direct, plain, durable; ~4 min a repeat).

    python benchmarks/bench_overhead.py [--samples 20] [--n 256] [--sleep 2] [--repeats 3]
        [--paths direct,plain,plain-sa,plain-6steps,plain-6steps-sa,durable,cli,cli-json]
        [--group-rows] [--long]
        [--storage file|moto|URL]

``--storage`` picks ROLLOUTS_STORAGE for every path (``moto`` starts a local moto S3 server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _common import LETTERS, letter_tasks, percentile, private_home
from _plain import plain_client, plain_worker, run_plain
from _storage import add_storage_option, use_storage

ALL_PATHS = ("direct", "plain", "plain-sa", "plain-6steps", "plain-6steps-sa", "durable", "cli", "cli-json")
CLI_QUEUE = "bench-cli"  # the CLI's own in-process worker; this process's worker never serves it


@dataclass
class Sample:
    wall: float
    ok: int
    cpu: float  # s, worker + client (this process, or the CLI's process tree)
    server_cpu: float  # s, the dev server
    batch: float = 0.0  # s, the TasksetRun's start to close on the server (durable paths only)


@dataclass
class Row:
    path: str
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)


def _tree_cpu(pid: int) -> float:
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


class Bench:
    """Everything one run needs: the server, the plain worker, the tasks files for the CLI."""

    def __init__(self, home: Path, server_pid: int, client: object) -> None:
        self.home = home
        self.server_pid = server_pid
        self.client = client
        self.count = 0
        self.job_id: str | None = None  # set by a durable path: its batch time is looked up

    async def measure(self, run: Callable[[], Awaitable[int]], *, subprocess_cpu: bool = False) -> Sample:
        self.count += 1
        self.job_id = None
        server0, self0, kids0 = _tree_cpu(self.server_pid), _self_cpu(), _children_cpu()
        t0 = time.perf_counter()
        ok = await run()
        wall = time.perf_counter() - t0
        cpu = (_children_cpu() - kids0) if subprocess_cpu else (_self_cpu() - self0)
        sample = Sample(wall=wall, ok=ok, cpu=cpu, server_cpu=_tree_cpu(self.server_pid) - server0)
        if self.job_id is not None:
            desc = await self.client.get_workflow_handle(f"job-{self.job_id}").describe()  # type: ignore[attr-defined]
            if desc.close_time is not None:
                sample.batch = (desc.close_time - desc.start_time).total_seconds()
        return sample

    def tasks_file(self, n: int) -> Path:
        path = self.home / f"tasks-{n}.jsonl"
        if not path.exists():
            path.write_text("".join(t.model_dump_json() + "\n" for t in letter_tasks(n)))
        return path

    async def path(self, name: str, n: int, sleep: float, concurrency: int, group: int = 1) -> Sample:
        from durable_rollouts.runtimes import LocalRuntime
        from durable_rollouts.sdk.agents import SleepAgent
        from durable_rollouts.sdk.direct import run_direct
        from durable_rollouts.sdk.taskset import Taskset

        runtime = LocalRuntime(LETTERS)
        agent = SleepAgent(seconds=sleep, answer="2")
        tasks = Taskset(f"b{self.count}", letter_tasks(n // group))

        async def durable() -> int:
            job = await tasks.run(agent, runtime=runtime, group=group, max_concurrent=concurrency)
            self.job_id = job.id
            return sum(r.reward == 1.0 for r in job.runs)

        async def direct() -> int:
            job = await run_direct(tasks, agent, runtime, group=group, max_concurrent=concurrency)
            return sum(r.reward == 1.0 for r in job.runs)

        async def plain(steps: int = 1, attrs: bool = False) -> int:
            return await run_plain(self.client, f"{os.getpid()}-{self.count}", n, concurrency, sleep,  # type: ignore[arg-type]
                                   steps, attrs)

        if name in ("cli", "cli-json"):
            return await self.measure(lambda: self.cli(name == "cli", n, sleep, concurrency),
                                      subprocess_cpu=True)
        runs = {"durable": durable, "direct": direct, "plain": plain, "plain-6steps": lambda: plain(6),
                "plain-sa": lambda: plain(attrs=True), "plain-6steps-sa": lambda: plain(6, attrs=True)}
        return await self.measure(runs[name])

    async def cli(self, bar: bool, n: int, sleep: float, concurrency: int) -> int:
        out = self.home / f"cli-{self.count}.json"
        err = self.home / f"cli-{self.count}.err"
        cmd = [sys.executable, "-m", "durable_rollouts.cli", "run", str(self.tasks_file(n)),
               "--agent", "sleep", "--agent-config", json.dumps({"seconds": sleep, "answer": "2"}),
               "--runtime", f"local:{LETTERS}", "--max-concurrent", str(concurrency),
               "--task-queue", CLI_QUEUE, "--json"]
        if bar:  # stderr on a pseudo-terminal: rich draws its live display as for a user
            line = f"{shlex.join(cmd)} > {shlex.quote(str(out))}"
            argv = ["script", "-qec", line, "/dev/null"]
            proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL,
                                                        stdout=err.open("wb"), stderr=subprocess.STDOUT)
        else:
            proc = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.DEVNULL,
                                                        stdout=out.open("wb"), stderr=err.open("wb"))
        await proc.wait()
        try:
            data = json.loads(out.read_text())
        except ValueError:
            raise SystemExit(f"rollouts run failed ({proc.returncode}): {err.read_text()[-2000:]}") from None
        if bar and b"\x1b[" not in err.read_bytes():
            raise SystemExit("the progress bar did not render on the pseudo-terminal")
        self.job_id = str(data["job_id"])
        return int(data["counts"].get("succeeded", 0))


async def latency(samples: int) -> None:
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.sdk.direct import run_direct
    from durable_rollouts.sdk.taskset import Taskset

    runtime, agent = LocalRuntime(LETTERS), FixedAgent(answer="2")
    durable, direct = [], []
    for i in range(samples):
        one = Taskset(f"one{i}", letter_tasks(1))
        t0 = time.perf_counter()
        job = await one.run(agent, runtime=runtime)
        durable.append(time.perf_counter() - t0)
        assert job.runs[0].reward == 1.0, job.runs[0].error
        t0 = time.perf_counter()
        await run_direct(one, agent, runtime)
        direct.append(time.perf_counter() - t0)
    d50, x50 = percentile(durable, 0.5) * 1000, percentile(direct, 0.5) * 1000
    print(f"concurrency 1, {samples} one-rollout batches (end to end; load average {os.getloadavg()[0]:.1f}):")
    print(f"  durable p50 {d50:.0f} ms  p90 {percentile(durable, 0.9) * 1000:.0f} ms")
    print(f"  direct  p50 {x50:.0f} ms  p90 {percentile(direct, 0.9) * 1000:.0f} ms")
    print(f"  added p50 latency {d50 - x50:.0f} ms", flush=True)


async def throughput(bench: Bench, title: str, paths: list[str], repeats: int, n: int, sleep: float,
                     concurrency: int, groups: tuple[int, ...] = (1,)) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for _ in range(repeats):
        for group in groups:
            for name in paths:
                key = name if len(groups) == 1 else f"{name} g{group}"
                sample = await bench.path(name, n, sleep, concurrency, group)
                rows.setdefault(key, Row(key)).samples.append(sample)
                print(f"    {key:12s} {sample.wall:6.1f} s  ok {sample.ok}/{n}  load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    ideal = n / concurrency * sleep
    print(f"{title}: {n} rollouts of a {sleep:g} s agent at concurrency {concurrency} "
          f"(ideal {ideal:.1f} s), median of {repeats}; 1-min load average now "
          f"{os.getloadavg()[0]:.1f} (a shared box above ~2 skews walls: compare A/B run close together):")
    print(f"  {'path':12s} {'wall s':>7s} {'runs':>16s} {'batch s':>8s} {'rollouts/s':>10s} "
          f"{'cpu ms/rollout':>15s} {'server ms/rollout':>18s}")
    for key, row in rows.items():
        walls = ", ".join(f"{s.wall:.1f}" for s in row.samples)
        batch = f"{row.median('batch'):.1f}" if row.median("batch") else "-"
        print(f"  {key:12s} {row.median('wall'):7.1f} {walls:>16s} {batch:>8s} {n / row.median('wall'):10.1f} "
              f"{row.median('cpu') / n * 1000:15.1f} {row.median('server_cpu') / n * 1000:18.1f}"
              f"   ok {min(s.ok for s in row.samples)}/{n}")
    return rows


def ratio(rows: dict[str, Row], num: str, den: str, label: str, attr: str = "wall") -> None:
    if num in rows and den in rows and rows[num].median(attr) > 0:
        what = "throughput" if attr == "wall" else "batch-time"
        print(f"  {label} {what} ratio {rows[den].median(attr) / rows[num].median(attr):.2f}")


def cpu_ratio(rows: dict[str, Row], n: int) -> None:
    """Worker CPU per rollout against a plain temporalio child's: raw, and with the env + agent
    work that every path with an environment pays (the direct path's CPU) taken out."""
    if not all(k in rows for k in ("durable", "plain", "direct")) or rows["plain"].median("cpu") <= 0:
        return
    durable, plain, direct = (rows[k].median("cpu") / n * 1000 for k in ("durable", "plain", "direct"))
    print(f"  durable/plain worker cpu ratio {durable / plain:.2f} "
          f"(orchestration only, durable - direct: {durable - direct:.1f} ms = {(durable - direct) / plain:.2f}x plain)")


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.paths import rollouts_home
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.sdk.direct import run_direct
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import _client, shutdown_embedded

    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(ALL_PATHS)
    if unknown or ("cli" in paths and shutil.which("script") is None):
        raise SystemExit(f"unknown paths {sorted(unknown)} (or no `script` for the cli path)")
    warm = Taskset("warm", letter_tasks(2))
    runtime = LocalRuntime(LETTERS)
    await warm.run(FixedAgent(answer="2"), runtime=runtime)  # server, worker, env import: not measured
    await run_direct(warm, FixedAgent(answer="2"), runtime)
    ours, _ = await _client(None)
    client = await plain_client(ours)
    state = json.loads((rollouts_home() / "temporal.json").read_text())
    bench = Bench(rollouts_home(), int(state["pid"]), client)
    async with plain_worker(client):
        await run_plain(client, "warm", 2, 2, 0.0)
        if args.samples:
            await latency(args.samples)
        rows = {} if args.no_main else await throughput(
            bench, "throughput", paths, args.repeats, args.n, args.sleep, args.concurrency)
        ratio(rows, "durable", "direct", "durable/direct")
        ratio(rows, "durable", "plain", "durable/plain")
        ratio(rows, "durable", "plain-sa", "durable/plain-sa")
        ratio(rows, "durable", "plain-6steps", "durable/plain-6steps")
        ratio(rows, "durable", "plain-6steps-sa", "durable/plain-6steps-sa")
        cpu_ratio(rows, args.n)
        ratio(rows, "cli", "cli-json", "cli (progress bar)/cli --json")
        ratio(rows, "cli", "durable", "cli (progress bar)/Taskset.run")
        # The CLI's wall includes its start-up (imports, connecting): compare the batches too.
        ratio(rows, "cli", "cli-json", "cli (progress bar)/cli --json", "batch")
        ratio(rows, "cli", "durable", "cli (progress bar)/Taskset.run", "batch")
        if args.group_rows:
            g = await throughput(bench, "distinct rows vs one row x group", ["durable", "direct"],
                                 args.repeats, args.n, args.sleep, args.concurrency, (1, args.n))
            ratio(g, "durable g1", f"durable g{args.n}", f"{args.n} rows / 1 row x {args.n}")
        if args.long:
            long = await throughput(bench, "long agents", ["direct", "plain", "durable"], args.repeats,
                                    128, 30.0, 64)
            ratio(long, "durable", "direct", "durable/direct (30 s agents)")
            ratio(long, "durable", "plain", "durable/plain (30 s agents)")
    await shutdown_embedded()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20, help="latency samples (0 = skip)")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default=",".join(ALL_PATHS))
    parser.add_argument("--group-rows", action="store_true", help="also: N rows vs 1 row x group N")
    parser.add_argument("--long", action="store_true", help="also: 128 x 30 s agents at concurrency 64")
    parser.add_argument("--no-main", action="store_true", help="skip the --n/--sleep throughput rows")
    add_storage_option(parser)
    args = parser.parse_args()
    with private_home() as home, use_storage(args.storage, home):
        asyncio.run(main(args))
