"""Width: N rollouts of an agent that waits W seconds, all in flight at once, on one worker.

Each ``--n`` runs N one-row rollouts (``LocalRuntime``, the letters env) of an agent that sleeps
``--wait`` seconds, at concurrency N, through ``Taskset.run``'s path (embedded dev server +
in-process worker, sized to the width), as one batch (``max_concurrent=N``; wider than
``ROLLOUTS_CHILDREN_PER_WORKFLOW`` it runs as parts, at most 100 child starts per workflow task).
``--batch K`` instead splits a width into batches of K started together on the same worker (the
only way before parts). Prints, per N:

- wall time (first start to last result) against the ideal W, and the ratio;
- the worker's RSS per in-flight rollout (RSS with every agent waiting, less RSS before);
- the server's and the worker's CPU per rollout over the whole run;
- CPU per idle in-flight rollout per second: both processes sampled over ``--window`` seconds
  while every agent waits (psutil), in ms of CPU per second per rollout; also net of the two
  processes' baseline with nothing in flight (sampled for 5 s before each width: pollers, the
  server's own timers);
- rollouts that reprovisioned (attempts > 1) or did not succeed.

The plain baseline is the ideal: W seconds of wall and no CPU while the agents wait.

``--tuner resource`` runs the same on a worker with temporalio's resource-based tuner instead.
``--stream`` runs each width as a streamed batch (``Taskset.start``'s path; wider than one
workflow, its parts feed the one stream) with a consumer in this process acking 16 groups at a
time; the wall then ends with the last acknowledgement, and ``delivered`` counts its groups.
``--plain`` follows each width with plain temporalio doing the same work on the same server
(``_plain.py``: ``--plain-parents`` K parents, each starting its N/K children at once, each child
in the Rollout's six-step shape with its search attributes, the middle step a W-second sleep with
no heartbeat): the engine's own floor for that width on this box, printed as a ``plain`` row with
the durable path's wall against it.

    python benchmarks/bench_width.py [--n 500,2000,5000] [--wait 60] [--window 20] [--settle 10] [--batch 500]
        [--tuner fixed|resource] [--stream] [--plain [--plain-parents K]]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import time
from pathlib import Path

import psutil
from _common import LETTERS, letter_tasks, private_home
from _width_agent import WaitAgent

BASELINE_S = 5.0  # seconds of sampling with nothing in flight, before each width


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


async def _plateau(n: int, deadline: float, counts: type = WaitAgent) -> int:
    """Wait until all ``n`` agents wait (or no more start for 5 s, or ``deadline``); ``counts``
    holds the ``waiting`` and ``started`` counters (``WaitAgent``, or ``_plain.Sleeping``)."""
    last, still = -1, time.monotonic()
    while time.monotonic() < deadline and counts.waiting < n:
        if counts.started != last:
            last, still = counts.started, time.monotonic()
        elif time.monotonic() - still > 5.0:
            break
        await asyncio.sleep(0.2)
    return counts.waiting


def _resource_worker(client, n: int):  # type: ignore[no-untyped-def]
    """A worker on its own queue with temporalio's resource-based tuner (slots up to the width,
    handed out while memory < 80% and CPU < 90%, one per 50 ms past the first: its defaults)."""
    from temporalio.worker import ResourceBasedSlotConfig, WorkerTuner

    from durable_rollouts.capacity import slots_for
    from durable_rollouts.worker import build_worker

    most = ResourceBasedSlotConfig(maximum_slots=slots_for(n))
    tuner = WorkerTuner.create_resource_based(target_memory_usage=0.8, target_cpu_usage=0.9,
                                              activity_config=most, local_activity_config=most)
    queue = f"width-resource-{n}"
    return build_worker(client, task_queue=queue, tuner=tuner), queue


async def _consume(job: object, delivered: list[int]) -> None:
    async for batch in job.stream(consumer="trainer", batch_size=16):  # type: ignore[attr-defined]
        delivered[0] += len(batch.groups)
        await batch.ack()


async def one(n: int, wait: float, window: float, server: psutil.Process, tuner: str,
              settle: float, batch: int, stream: bool = False) -> dict[str, float]:
    from durable_rollouts import LocalRuntime, Taskset
    from durable_rollouts.settings import settings
    from durable_rollouts.temporal.batches import _client, _ensure_worker, start_job
    from durable_rollouts.temporal.live import start_live
    from durable_rollouts.workflows.types import MAX_CONCURRENT

    own: dict[str, object] = {}
    worker = None
    if tuner == "resource":
        client, _ = await _client(None)
        worker, queue = _resource_worker(client, n)
        await worker.__aenter__()
        own = {"worker": False, "temporal": client, "task_queue": queue}

    me = psutil.Process()
    rss0 = me.memory_info().rss
    b0, bs0 = _cpu(me), _cpu(server)  # the baseline: server and worker with nothing in flight
    await asyncio.sleep(BASELINE_S)
    base_worker, base_server = (_cpu(me) - b0) / BASELINE_S, (_cpu(server) - bs0) / BASELINE_S
    cpu0, server0 = _cpu(me), _cpu(server)
    WaitAgent.started = 0
    batches = math.ceil(n / min(batch or n, MAX_CONCURRENT))
    if batches > 1 and tuner == "fixed":  # in a session: size the one in-process worker for all
        client, _ = await _client(None)
        await (await _ensure_worker(client, settings().task_queue, n)).release()
    sizes = [n // batches + (1 if i < n % batches else 0) for i in range(batches)]
    rows = letter_tasks(n)
    t0, _ = time.perf_counter(), psutil.cpu_percent()  # (starts its count)
    handles, offset, delivered, consumers = [], 0, [0], []
    for i, size in enumerate(sizes):
        taskset = Taskset(f"width-{n}-{i}", rows[offset:offset + size])
        offset += size
        start = functools.partial(start_live, consumers=["trainer"], linger_s=120.0) if stream else start_job
        handle = await start(taskset, WaitAgent(seconds=wait), runtime=LocalRuntime(LETTERS),
                             max_concurrent=size, **own)  # type: ignore[arg-type]
        if stream:  # Taskset.start's path: a LiveJob, consumed here
            consumers.append(asyncio.ensure_future(_consume(handle, delivered)))
        handles.append(handle)
    started_all = time.perf_counter() - t0
    reached = await _plateau(n, time.monotonic() + wait * 0.8)
    ramp = time.perf_counter() - t0
    ramp_busy = psutil.cpu_percent() / 100  # the box's cores, busy since t0
    rss = me.memory_info().rss
    await asyncio.sleep(max(0.0, min(settle, WaitAgent.first + wait - time.monotonic() - 5.0)))
    # sample only while every agent that started still waits: end before the first one is done
    idle_window = max(1.0, min(window, WaitAgent.first + wait - time.monotonic() - 1.0))
    c0, s0 = _cpu(me), _cpu(server)
    await asyncio.sleep(idle_window)
    idle_worker, idle_server = _cpu(me) - c0, _cpu(server) - s0
    in_flight = WaitAgent.waiting
    await asyncio.gather(*consumers)
    jobs = await asyncio.gather(*(h.wait() for h in handles))
    wall = time.perf_counter() - t0
    if worker is not None:
        await worker.__aexit__(None, None, None)
    runs = [r for job in jobs for r in job.runs]
    per_idle = 1000.0 / max(1, in_flight) / idle_window
    return {
        "n": n, "wait": wait, "wall": wall, "ratio": wall / wait, "batches": batches,
        "start_s": started_all, "ramp_s": ramp, "ramp_busy": ramp_busy, "reached": reached,
        "in_flight": in_flight,
        "rss_kib": (rss - rss0) / 1024 / max(1, reached),
        "worker_ms": (_cpu(me) - cpu0) * 1000 / n, "server_ms": (_cpu(server) - server0) * 1000 / n,
        "idle_window": idle_window,
        "idle_worker": idle_worker * per_idle, "idle_server": idle_server * per_idle,
        "net_idle": (idle_worker + idle_server - (base_worker + base_server) * idle_window) * per_idle,
        "reprovisioned": sum(1 for r in runs if (r.attempts or 1) > 1),
        "not_ok": sum(1 for r in runs if r.status != "succeeded"), "delivered": delivered[0],
    }


async def one_plain(n: int, wait: float, server: psutil.Process, parents: int) -> dict[str, float]:
    """Plain temporalio doing the same work at width ``n`` (``--plain``), on the same server, as
    ``parents`` parent workflows of about n/parents children each."""
    from _plain import Sleeping, plain_client, plain_worker, run_plain

    from durable_rollouts.temporal.batches import _client

    client = await plain_client((await _client(None))[0])
    me = psutil.Process()
    async with plain_worker(client, slots=n):
        await run_plain(client, f"width-warm-{n}-{time.monotonic_ns()}", 2, 2, 0.0)
        Sleeping.started = 0
        cpu0, server0 = _cpu(me), _cpu(server)
        t0, _ = time.perf_counter(), psutil.cpu_percent()  # (starts its count)
        sizes = [n // parents + (1 if i < n % parents else 0) for i in range(parents)]
        answered = asyncio.gather(*(run_plain(client, f"width-{n}-{i}-{time.monotonic_ns()}", size, size, wait,
                                              steps=6, attrs=True, heartbeat=False)
                                    for i, size in enumerate(sizes)))
        reached = await _plateau(n, time.monotonic() + wait * 0.8, Sleeping)
        ramp = time.perf_counter() - t0
        ramp_busy = psutil.cpu_percent() / 100  # the box's cores, busy since t0
        ok = sum(await answered)
        wall = time.perf_counter() - t0
    return {"wall": wall, "ratio": wall / wait, "ramp_s": ramp, "ramp_busy": ramp_busy,
            "reached": reached, "ok": ok,
            "worker_ms": (_cpu(me) - cpu0) * 1000 / n, "server_ms": (_cpu(server) - server0) * 1000 / n}


async def main(ns: list[int], wait: float, window: float, tuner: str, settle: float, batch: int,
               stream: bool = False, plain: int = 0) -> None:
    from durable_rollouts import LocalRuntime, Taskset
    from durable_rollouts.temporal.batches import shutdown_embedded, start_job

    await (await start_job(Taskset("warm", letter_tasks(2)), WaitAgent(seconds=0.1),
                           runtime=LocalRuntime(LETTERS))).wait()  # starts the embedded server
    home = Path(os.environ["ROLLOUTS_HOME"])  # private_home's
    server = psutil.Process(json.loads((home / "temporal.json").read_text())["pid"])
    print(f"{'N':>6} {'W s':>5} {'wall s':>7} {'x W':>5} {'ramp s':>7} {'waiting':>8} "
          f"{'RSS KiB/rollout':>15} {'worker ms/rollout':>17} {'server ms/rollout':>17} "
          f"{'idle worker ms/s':>16} {'idle server ms/s':>16} {'idle total':>10} {'net of base':>11} "
          f"{'reprov':>6} {'not ok':>6}")
    for n in ns:
        r = await one(n, wait, window, server, tuner, settle, batch, stream)
        print(f"{n:>6} {wait:>5.0f} {r['wall']:>7.1f} {r['ratio']:>5.2f} {r['ramp_s']:>7.1f} "
              f"{r['in_flight']:>8.0f} {r['rss_kib']:>15.0f} {r['worker_ms']:>17.1f} "
              f"{r['server_ms']:>17.1f} {r['idle_worker']:>16.3f} {r['idle_server']:>16.3f} "
              f"{r['idle_worker'] + r['idle_server']:>10.3f} {r['net_idle']:>11.3f} "
              f"{r['reprovisioned']:>6} {r['not_ok']:>6}",
              flush=True)
        print(f"       ({r['batches']} batch(es); all started in {r['start_s']:.1f} s; box CPU "
              f"{r['ramp_busy']:.0%} busy over the ramp; idle sampled "
              f"over {r['idle_window']:.0f} s with {r['in_flight']:.0f} agents waiting"
              + (f"; {r['delivered']} groups streamed" if stream else "") + ")", flush=True)
        if plain:
            p = await one_plain(n, wait, server, plain)
            print(f" plain {wait:>5.0f} {p['wall']:>7.1f} {p['ratio']:>5.2f} {p['ramp_s']:>7.1f} "
                  f"{p['reached']:>8.0f} {'':>15} {p['worker_ms']:>17.1f} {p['server_ms']:>17.1f}", flush=True)
            print(f"       (plain temporalio, same work, {plain} parent(s): {p['ok']:.0f} of {n} "
                  f"answered; box CPU {p['ramp_busy']:.0%} busy over the ramp; the durable path's "
                  f"wall is {r['wall'] / p['wall']:.2f} x plain's)", flush=True)
    await shutdown_embedded()


async def session_main(ns: list[int], wait: float, window: float, tuner: str, settle: float,
                       batch: int, stream: bool, plain: int) -> None:
    from durable_rollouts import session

    async with session():  # widths above one batch's start batches on one worker
        await main(ns, wait, window, tuner, settle, batch, stream, plain)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", default="500,2000,5000", help="comma-separated widths")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds each agent waits (W)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of idle sampling")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds after the ramp before idle sampling (the server's lagging "
                             "visibility and transfer work); cut short to leave 5 s of window")
    parser.add_argument("--batch", type=int, default=0,
                        help="rollouts per batch: 0 (the default) runs each width as one batch "
                             "(parts past ROLLOUTS_CHILDREN_PER_WORKFLOW); K > 0 starts several "
                             "batches of K at once on the same worker")
    parser.add_argument("--tuner", choices=["fixed", "resource"], default="fixed",
                        help="fixed: Taskset.run's in-process worker, slots sized from the width; "
                             "resource: a worker with temporalio's resource-based tuner")
    parser.add_argument("--stream", action="store_true",
                        help="each width as a streamed batch, consumed and acked in this process")
    parser.add_argument("--plain", action="store_true",
                        help="after each width, plain temporalio doing the same work (the floor)")
    parser.add_argument("--plain-parents", type=int, default=1,
                        help="--plain: parent workflows the width is split over (the durable path "
                             "splits past ROLLOUTS_CHILDREN_PER_WORKFLOW)")
    args = parser.parse_args()
    from durable_rollouts.settings import settings

    config = settings()
    print(f"tuner={args.tuner} stream={args.stream} worker watch={config.worker_watch:g} s "
          f"agent heartbeat timeout={config.agent_heartbeat_s:g} s", flush=True)
    with private_home():
        asyncio.run(session_main([int(x) for x in args.n.split(",")], args.wait, args.window, args.tuner,
                                 args.settle, args.batch, args.stream,
                                 args.plain_parents if args.plain else 0))
