"""Scale: N trivial rollouts through the durable path (embedded server + in-process worker).

Reports wall time, rollouts/s, the worker's peak RSS (this process) and the longest history of
any workflow run (TasksetRun runs after continue-as-new, and Rollout children); the bytes per
rollout kept in history (sum of event sizes from fetch_history) vs in ``--storage`` (objects
added during the run); and, in the same run, the direct executor on the same tasks (``--direct``)
and plain temporalio (``--plain``: one parent workflow per 2,000 children, each child shaped as
``--plain-shapes`` says, on the same server; ``_plain.py``): ``1step`` (one no-op activity, the
floor of any children + activities layout), ``6steps`` (the card's six steps, five of them
no-op local activities: the fair baseline of the Rollout's shape) and ``6steps-sa`` (the same
with the search attributes every Rollout carries). Peak RSS is sampled for the worker process
and the dev server (``worker+server``).

    python benchmarks/bench_scale.py --n 10000 --concurrency 256 [--plain [--plain-shapes 1step,6steps,6steps-sa]]
        [--direct] [--storage file|moto|URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import psutil
from _common import LETTERS, letter_tasks, peak_rss_mb, private_home
from _storage import add_storage_option, history_bytes, storage_bytes, use_storage

PLAIN_SHAPES = {"1step": (1, False), "6steps": (6, False), "6steps-sa": (6, True)}


class PeakRSS:
    """The largest RSS (MiB) ``proc`` reached while sampled every ``every`` seconds."""

    def __init__(self, proc: psutil.Process, every: float = 0.5) -> None:
        self.proc, self.every, self.peak = proc, every, 0.0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.proc.memory_info().rss / 2**20)
            await asyncio.sleep(self.every)

    def __enter__(self) -> PeakRSS:
        self._task = asyncio.ensure_future(self._sample())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def main(n: int, concurrency: int, sample: int, storage: str, direct: bool, plain: bool,
               shapes: list[str]) -> None:
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import _client, shutdown_embedded, start_job

    taskset = Taskset("scale", letter_tasks(n))
    warm = Taskset("warm", letter_tasks(2))
    await (await start_job(warm, FixedAgent(answer="2"), runtime=LocalRuntime(LETTERS))).wait()
    from durable_rollouts.paths import rollouts_home

    server = psutil.Process(json.loads((rollouts_home() / "temporal.json").read_text())["pid"])
    me = psutil.Process()
    cpu0, server0 = _cpu(me), _cpu(server)
    objects0, stored0 = storage_bytes(storage)
    t0 = time.perf_counter()
    with PeakRSS(server) as server_rss:
        handle = await start_job(taskset, FixedAgent(answer="2"), runtime=LocalRuntime(LETTERS),
                                 max_concurrent=concurrency)
        job = await handle.wait()
    wall = time.perf_counter() - t0
    cpu, server_cpu = _cpu(me) - cpu0, _cpu(server) - server0
    rss = peak_rss_mb()
    objects1, stored1 = storage_bytes(storage)
    client, _ = await _client(None)
    sampled = sample
    hist = await history_bytes(client, job.id, sample=sample)
    parent_max, child_max, runs = 0, 0, 0
    async for wf in client.list_workflows(f'RolloutsJobId = "{job.id}"'):
        if wf.workflow_type == "TasksetRun":
            runs += 1
            parent_max = max(parent_max, wf.history_length)
        elif sample > 0:
            sample -= 1
            child_max = max(child_max, wf.history_length)
    counts = job.status_counts()
    _report(n, concurrency, counts, wall, rss, cpu, server_cpu, runs, parent_max, child_max, storage,
            hist, sampled, stored1 - stored0, objects1 - objects0)
    print(f"peak RSS worker+server {rss + server_rss.peak:.0f} MiB (server {server_rss.peak:.0f} MiB)")
    for shape in shapes if plain else []:
        plain_wall, line = await _plain_run(client, server, n, concurrency, *PLAIN_SHAPES[shape])
        print(f"{line}", flush=True)
        print(f"durable/plain-{shape} throughput ratio {plain_wall / wall:.2f}", flush=True)
    await shutdown_embedded()
    direct_wall = None
    if direct:
        from durable_rollouts.sdk.direct import run_direct

        t0 = time.perf_counter()
        djob = await run_direct(taskset, FixedAgent(answer="2"), LocalRuntime(LETTERS),
                                max_concurrent=concurrency)
        direct_wall = time.perf_counter() - t0
        assert len(djob.runs) == n
    if direct_wall is not None:
        print(f"direct              {direct_wall:.1f} s = {n / direct_wall:.1f} rollouts/s; "
              f"durable/direct throughput {direct_wall / wall:.2f}")


def _report(n: int, concurrency: int, counts: object, wall: float, rss: float, cpu: float,
            server_cpu: float, runs: int, parent_max: int, child_max: int, storage: str,
            hist: dict, sampled: int, stored: int, objects: int) -> None:
    print(f"rollouts            {n} (concurrency {concurrency})")
    print(f"statuses            {counts}")
    print(f"wall time           {wall:.1f} s")
    print(f"throughput          {n / wall:.1f} rollouts/s")
    print(f"peak RSS (worker+client, one process) {rss:.0f} MiB")
    print(f"CPU per rollout     worker+client {1000 * cpu / n:.1f} ms, server {1000 * server_cpu / n:.1f} ms "
          f"({(cpu + server_cpu) / wall:.2f} cores busy)")
    print(f"TasksetRun runs     {runs} (continue-as-new {runs - 1}x); max history {parent_max} events")
    print(f"Rollout history     max {child_max} events (sampled children)")
    print(f"storage             {storage}")
    print(f"history bytes       {hist['bytes'] / n:.0f} B/rollout (TasksetRun {hist['parent_bytes'] / n:.0f}"
          f" + Rollout {hist['child_bytes'] / n:.0f}; children sampled: {sampled or 'all'})")
    print(f"storage bytes       {stored / n:.0f} B/rollout "
          f"({objects} objects, {stored / 1e6:.1f} MB)")


PLAIN_CHILDREN_PER_PARENT = 2_000


async def _plain_run(ours: object, server: psutil.Process, n: int, concurrency: int, steps: int = 1,
                     attrs: bool = False) -> tuple[float, str]:
    """The same number of trivial children through plain temporalio, on the same server."""
    from _plain import plain_client, plain_worker, run_plain

    client = await plain_client(ours)  # type: ignore[arg-type]
    me = psutil.Process()
    async with plain_worker(client):
        await run_plain(client, "scale-warm", 2, 2, 0.0)
        cpu0, server0, t0 = _cpu(me), _cpu(server), time.perf_counter()
        # One plain parent per 2,000 children (a single parent of 10,000 passes the server's
        # history event limit: plain temporalio has no continue-as-new), the slots split evenly.
        parents = max(1, -(-n // PLAIN_CHILDREN_PER_PARENT))
        with PeakRSS(server) as server_rss:
            done = sum(await asyncio.gather(*(
                run_plain(client, f"scale-{steps}{'sa' if attrs else ''}-{i}", len(range(i, n, parents)),
                          max(1, concurrency // parents), 0.0, steps, attrs)
                for i in range(parents))))
        wall = time.perf_counter() - t0
        cpu, server_cpu = _cpu(me) - cpu0, _cpu(server) - server0
    assert done == n, f"plain: {done}/{n} children answered"
    shape = f"{steps} step{'s' if steps > 1 else ''}{' + search attributes' if attrs else ''}"
    return wall, (f"plain temporalio, {shape} ({parents} parents) {wall:.1f} s = {n / wall:.1f} rollouts/s; "
                  f"CPU per rollout worker {1000 * cpu / n:.1f} ms, server {1000 * server_cpu / n:.1f} ms "
                  f"({(cpu + server_cpu) / wall:.2f} cores busy); server peak RSS {server_rss.peak:.0f} MiB")


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--sample", type=int, default=200, help="children whose history to check")
    parser.add_argument("--direct", action="store_true", help="also run the direct executor")
    parser.add_argument("--plain", action="store_true", help="also run plain temporalio (same server)")
    parser.add_argument("--plain-shapes", default="6steps",
                        help=f"plain children's shapes, comma-separated: {', '.join(PLAIN_SHAPES)}")
    add_storage_option(parser)
    args = parser.parse_args()
    with private_home() as home, use_storage(args.storage, home) as url:
        shapes = [x for x in args.plain_shapes.split(",") if x]
        if set(shapes) - set(PLAIN_SHAPES):
            parser.error(f"--plain-shapes: unknown {sorted(set(shapes) - set(PLAIN_SHAPES))}")
        asyncio.run(main(args.n, args.concurrency, args.sample, url, args.direct, args.plain, shapes))
