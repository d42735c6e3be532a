"""Stream throughput: a batch's finished groups delivered to a consumer that acks every batch.

``--n`` trivial rollouts (``--group`` per row, so n / group groups) on the embedded server with
an in-process worker, three ways in one run: ``Taskset.run`` (no consumer: the batch's own pace),
then ``Taskset.start`` + ``job.stream(batch_size=B)`` + ``batch.ack()`` for each ``--batch-sizes``
B, the consumer in the worker's process as a trainer would run it. For each: wall time, groups/s
and rollouts/s, CPU of this process and of the dev server, peak RSS of both (VmHWM, reset before
each phase); for a stream also ack latency (p50/p99 of ``await batch.ack()``), delivery lag
(a group's last member ended in its Rollout workflow -> the consumer has it, p50/p99) and how
long asking for the next batch took. ``--cli`` adds ``rollouts stream JOB -o FILE`` as a
subprocess consumer (fsync per batch). The run goes again at the end (a shared box drifts);
each stream is compared with the mean of both: ``stream b=B / run throughput ratio R``.

    python benchmarks/bench_stream.py --n 10000 --group 4 --concurrency 256 --batch-sizes 1,8 [--cli]

``--long`` is the long-job mode (issue 39): one job of ``--n`` rollouts read by one consumer
process per batch size (``_stream_consumer.py``, all registered, so a group leaves the batch's
state only once every consumer acknowledged it), between two ``Taskset.run`` of ``--baseline-n``
rollouts (the stream's groups/s is compared with theirs: a rate, so the runs can be shorter). It
reports each consumer's ack latency and delivery lag, peak RSS of this process (the worker) and
of the server when 10%, 50% and 100% of the groups were finished, the most groups the batch kept
in its state (its ``stream_kept`` query, sampled) and the largest continue-as-new carry (the
input of every run after the first, from the batch's history): with pages (``--page-size``)
neither grows with the job's length.

    python benchmarks/bench_stream.py --long --n 100000 --group 4 --batch-sizes 1,8 [--page-size 128] [--pipelined]

``--pipelined``: the consumers ack with ``batch.ack(wait=False)`` (one ack in flight, the acks sent
meanwhile recorded together when it lands). Each consumer also reports its batch lag: a batch's
last group ended -> the consumer has the batch (the delivery lag without the wait for a batch of
B groups to fill). ``stream_histories.py --home HOME`` (HOME printed at the end) reads where
the lag went from the batch's histories.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil
import _memtrace
from _common import LETTERS, letter_tasks, peak_mb, percentile, private_home

CONSUMER = "bench"
# --long samples the job's kept state (the ``stream_kept`` query) this often. A query that reaches
# the batch while its last workflow task before a continue-as-new is in flight is answered after
# the close by a replay of the whole closed run (5,600 events, ~16 MiB of worker memory for a few
# seconds): a sampler every 2 s caused some of the peaks it was measuring. Every 30 s, the RSS
# marks land within 1% of the job of their 10/50%.
KEPT_EVERY_S = 30.0


@dataclass
class Phase:
    """CPU seconds and peak RSS of this process and the server over one phase."""

    me: psutil.Process
    server: psutil.Process
    wall: float = 0.0
    cpu: float = 0.0
    server_cpu: float = 0.0
    rss_mb: float = 0.0
    server_rss_mb: float = 0.0
    acks: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    fetches: list[float] = field(default_factory=list)  # asking for the next batch -> having it
    groups: int = 0
    consumer_cpu: float | None = None  # a consumer subprocess's CPU seconds
    _t0: float = 0.0
    _cpu0: tuple[float, float] = (0.0, 0.0)

    def __enter__(self) -> Self:
        for proc in (self.me, self.server):
            _reset_peak(proc.pid)
        self._cpu0 = (_cpu(self.me), _cpu(self.server))
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t0
        self.cpu = _cpu(self.me) - self._cpu0[0]
        self.server_cpu = _cpu(self.server) - self._cpu0[1]
        self.rss_mb, self.server_rss_mb = peak_mb(self.me.pid), peak_mb(self.server.pid)

    def __exit__(self, *exc: object) -> None:
        if not self.wall:
            self.stop()


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _reset_peak(pid: int) -> None:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def run_phase(taskset, agent, runtime, group: int, concurrency: int, phase: Phase) -> None:
    with phase:
        job = await taskset.run(agent, runtime=runtime, group=group, max_concurrent=concurrency)
    phase.groups = len({r.group_id for r in job.runs})
    assert len(job.runs) == len(taskset) * group and all(r.status == "succeeded" for r in job.runs)


async def stream_phase(taskset, agent, runtime, group: int, concurrency: int, batch_size: int,
                       phase: Phase) -> None:
    with phase:
        job = await taskset.start(agent, runtime=runtime, group=group, max_concurrent=concurrency,
                                  consumers=[CONSUMER], linger_s=600)
        asked = time.perf_counter()
        async for batch in job.stream(consumer=CONSUMER, batch_size=batch_size):
            phase.fetches.append(time.perf_counter() - asked)
            now = time.time()
            phase.lags += [now - max(r.ended_at or now for r in rec.results) for rec in batch.records]
            t0 = time.perf_counter()
            await batch.ack()
            phase.acks.append(time.perf_counter() - t0)
            phase.groups += len(batch.records)
            asked = time.perf_counter()
        phase.stop()
        done = await job.wait()  # every consumer caught up: the batch closes
    assert phase.groups == len(taskset), (phase.groups, len(taskset))
    assert all(r.status == "succeeded" for r in done.runs)


async def cli_phase(taskset, agent, runtime, group: int, concurrency: int, batch_size: int,
                    phase: Phase, out: Path) -> None:
    """The same batch consumed by ``rollouts stream -o FILE`` in a subprocess (fsync per batch)."""
    rollouts = str(Path(sys.executable).parent / "rollouts")
    children0 = _children_cpu()
    with phase:
        job = await taskset.start(agent, runtime=runtime, group=group, max_concurrent=concurrency,
                                  consumers=["cli"], linger_s=600)
        proc = await asyncio.create_subprocess_exec(
            rollouts, "stream", job.id, "--consumer", "cli", "--batch-size", str(batch_size),
            "-o", str(out), stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        phase.stop()
        phase.consumer_cpu = _children_cpu() - children0
        assert proc.returncode == 0, err.decode()[-2000:]
        await job.wait()
    phase.groups = len(out.read_text().splitlines())
    assert phase.groups == len(taskset), phase.groups


@dataclass
class Long:
    """What a ``--long`` stream phase measured beyond its Phase."""

    rss_at: dict[int, tuple[float, float]] = field(default_factory=dict)  # % -> (worker, server) MiB
    kept_max: int = 0
    state_max: int = 0
    carries: list[int] = field(default_factory=list)


async def long_phase(taskset, agent, runtime, group: int, concurrency: int,
                     batch_sizes: list[int], phase: Phase, page_size: int, address: str,
                     long: Long, pipelined: bool = False) -> dict[int, dict]:
    """One job, one consumer process per batch size (``_stream_consumer.py``), sampled as it goes.

    Every consumer is registered, so a group leaves the workflow's state only when all of them
    acknowledged it; the slower one sets how much the batch keeps. Returns each consumer's log.
    """
    from durable_rollouts.temporal.open_run import query_latest
    from durable_rollouts.workflows import TasksetRun, workflow_id
    from durable_rollouts.workflows.types import TasksetRunInput

    total = len(taskset)
    names = {size: f"{CONSUMER}-b{size}" for size in batch_sizes}
    with phase:
        job = await taskset.start(agent, runtime=runtime, group=group, max_concurrent=concurrency,
                                  consumers=list(names.values()), linger_s=600, page_size=page_size)
        procs = {size: await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).parent / "_stream_consumer.py"), address, job.id,
            name, str(size), *(["pipelined"] if pipelined else []), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
            for size, name in names.items()}
        handle = job.client.get_workflow_handle(workflow_id(job.id))
        marks = [10, 50]
        outs = {size: asyncio.ensure_future(proc.communicate()) for size, proc in procs.items()}
        last_print = time.monotonic()
        while not all(out.done() for out in outs.values()):
            try:
                kept = await query_latest(handle, TasksetRun.stream_kept)
            except Exception:  # noqa: BLE001 - between two runs, or closed
                await asyncio.sleep(0.5)
                continue
            long.kept_max = max(long.kept_max, kept.kept_groups)
            long.state_max = max(long.state_max, kept.state_bytes)
            delivered = kept.base + kept.kept_groups
            while marks and delivered * 100 >= marks[0] * total:
                long.rss_at[marks.pop(0)] = (peak_mb(phase.me.pid), peak_mb(phase.server.pid))
            if time.monotonic() - last_print > 300:  # a sign of life on a run of an hour or more
                last_print = time.monotonic()
                print(f"  ... {delivered}/{total} groups finished, {kept.kept_groups} kept, "
                      f"{time.perf_counter() - phase._t0:.0f} s, peak RSS worker / server "
                      f"{peak_mb(phase.me.pid):.0f} / {peak_mb(phase.server.pid):.0f} MiB",
                      flush=True)
            await asyncio.wait(set(outs.values()), timeout=KEPT_EVERY_S,
                               return_when=asyncio.FIRST_COMPLETED)
        phase.stop()
        long.rss_at[100] = (phase.rss_mb, phase.server_rss_mb)
        logs: dict[int, dict] = {}
        for size, out in outs.items():
            stdout, err = out.result()
            assert procs[size].returncode == 0, err.decode()[-2000:]
            logs[size] = json.loads(stdout.decode().splitlines()[-1])
            assert logs[size]["groups"] == total, (size, logs[size]["groups"], total)
        phase.groups = total
        await job.wait()
    wid = workflow_id(job.id)
    async for execution in job.client.list_workflows(f'WorkflowId="{wid}"'):
        events = job.client.get_workflow_handle(wid, run_id=execution.run_id).fetch_history_events()
        async for event in events:  # only the first event: the run's input
            started = event.workflow_execution_started_event_attributes
            if started.continued_execution_run_id:  # the input itself (one over 256 KiB is stored)
                (carried,) = await job.client.data_converter.decode(started.input.payloads,
                                                                     [TasksetRunInput])
                long.carries.append(len(carried.model_dump_json()))
            break
    return logs


def report_long(long: Long, logs: dict[int, dict]) -> None:
    rss = ", ".join(f"{pct}%: {w:.0f} / {s:.0f}" for pct, (w, s) in sorted(long.rss_at.items()))
    carry = max(long.carries, default=0)
    for size, log in sorted(logs.items()):
        ms = [1000 * a for a in log["acks"]]
        lag = [1000 * x for x in log["lags"]]
        ready = [1000 * x for x in log.get("batch_lags", [])] or [float("nan")]
        print(f"{'':<22} consumer b={size}: {len(ms)} acks p50 {percentile(ms, 0.5):.0f} ms, "
              f"p99 {percentile(ms, 0.99):.0f} ms; delivery lag p50 {percentile(lag, 0.5):.0f} ms, "
              f"p99 {percentile(lag, 0.99):.0f} ms; batch lag (its last group) p50 "
              f"{percentile(ready, 0.5):.0f} ms, p99 {percentile(ready, 0.99):.0f} ms", flush=True)
    growth = 100 * (long.rss_at[100][0] / long.rss_at[10][0] - 1) if 10 in long.rss_at else float("nan")
    sgrowth = 100 * (long.rss_at[100][1] / long.rss_at[10][1] - 1) if 10 in long.rss_at else float("nan")
    print(f"{'':<22} peak RSS worker / server MiB at {rss} (growth 10%->100%: worker {growth:+.0f}%, "
          f"server {sgrowth:+.0f}%); kept at most {long.kept_max} groups "
          f"({long.state_max / 1024:.0f} KiB of stream state); {len(long.carries)} continue-as-new, "
          f"largest carry {carry / 1024:.0f} KiB", flush=True)


def report(name: str, phase: Phase, rollouts: int) -> None:
    print(f"{name:<22} {phase.wall:7.1f} s  {phase.groups / phase.wall:6.1f} groups/s "
          f"({rollouts / phase.wall:5.1f} rollouts/s)  CPU this process {phase.cpu:6.1f} s, "
          f"server {phase.server_cpu:6.1f} s  peak RSS this process {phase.rss_mb:.0f} MiB, "
          f"server {phase.server_rss_mb:.0f} MiB", flush=True)
    if phase.consumer_cpu is not None:
        print(f"{'':<22} CPU of the `rollouts stream` process {phase.consumer_cpu:.1f} s", flush=True)
    if phase.acks:
        ms = [1000 * a for a in phase.acks]
        lag = [1000 * x for x in phase.lags]
        print(f"{'':<22} {len(ms)} acks: p50 {percentile(ms, 0.5):.0f} ms, p99 "
              f"{percentile(ms, 0.99):.0f} ms, max {max(ms):.0f} ms; delivery lag p50 "
              f"{percentile(lag, 0.5):.0f} ms, p99 {percentile(lag, 0.99):.0f} ms; next batch "
              f"fetched in p50 {1000 * percentile(phase.fetches, 0.5):.0f} ms", flush=True)


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.paths import rollouts_home
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent
    from durable_rollouts.sdk.taskset import Taskset

    rows = args.n // args.group
    taskset = Taskset("stream-bench", letter_tasks(rows))
    agent, runtime = FixedAgent(answer="2"), LocalRuntime(LETTERS)
    warm = Taskset("warm", letter_tasks(4))
    await warm.run(agent, runtime=runtime, group=2)
    live = await warm.start(agent, runtime=runtime, group=2, consumers=[CONSUMER])
    async for batch in live.stream(consumer=CONSUMER, batch_size=2):
        await batch.ack()
    await live.wait()

    server = psutil.Process(json.loads((rollouts_home() / "temporal.json").read_text())["pid"])
    me = psutil.Process()
    total = rows * args.group
    print(f"{total} rollouts = {rows} groups of {args.group}, concurrency {args.concurrency}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    if args.long:
        await long_main(args, taskset, agent, runtime, me, server)
        return
    base = Phase(me, server)
    await run_phase(taskset, agent, runtime, args.group, args.concurrency, base)
    report("run (no consumer)", base, total)
    streams: list[tuple[str, Phase]] = []
    for size in args.batch_sizes:
        phase = Phase(me, server)
        await stream_phase(taskset, agent, runtime, args.group, args.concurrency, size, phase)
        report(f"stream b={size}", phase, total)
        streams.append((f"stream b={size}", phase))
    if args.cli:
        size = args.batch_sizes[-1]
        phase = Phase(me, server)
        await cli_phase(taskset, agent, runtime, args.group, args.concurrency, size, phase,
                        rollouts_home() / "cli-stream.jsonl")
        report(f"rollouts stream b={size}", phase, total)
        streams.append((f"rollouts stream b={size}", phase))
    # The run again at the end: a shared box drifts; each stream is compared with both runs' mean.
    again = Phase(me, server)
    await run_phase(taskset, agent, runtime, args.group, args.concurrency, again)
    report("run again", again, total)
    mean = (base.wall + again.wall) / 2
    for name, phase in streams:
        print(f"{name} / run throughput ratio {mean / phase.wall:.2f}", flush=True)
    print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


async def long_main(args: argparse.Namespace, taskset, agent, runtime, me, server) -> None:
    """``--long``: ``Taskset.run`` of ``--baseline-n`` rollouts, the one long streamed job, the
    run again; the stream's groups/s against the two runs' mean (a rate: the runs are shorter)."""
    from durable_rollouts.paths import rollouts_home
    from durable_rollouts.sdk.taskset import Taskset

    port = json.loads((rollouts_home() / "temporal.json").read_text())["port"]
    base_rows = max(1, min(args.n, args.baseline_n) // args.group)
    short = Taskset("stream-bench-run", letter_tasks(base_rows))
    runs: list[Phase] = []
    for name in ("run (no consumer)", None, "run again"):
        if name is None:
            phase, long = Phase(me, server), Long()
            logs = await long_phase(taskset, agent, runtime, args.group, args.concurrency,
                                    args.batch_sizes, phase, args.page_size,
                                    f"127.0.0.1:{port}", long, args.pipelined)
            acks = ", pipelined acks" if args.pipelined else ""
            report(f"one job, consumers b={','.join(map(str, args.batch_sizes))}{acks}", phase,
                   len(taskset) * args.group)
            report_long(long, logs)
            continue
        run = Phase(me, server)
        await run_phase(short, agent, runtime, args.group, args.concurrency, run)
        report(name, run, base_rows * args.group)
        runs.append(run)
    rate = sum(r.groups / r.wall for r in runs) / len(runs)
    print(f"stream / run groups/s ratio {phase.groups / phase.wall / rate:.2f} "
          f"(runs of {base_rows * args.group} rollouts)", flush=True)
    print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000, help="rollouts (n / group groups)")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8], help="comma-separated stream batch sizes")
    parser.add_argument("--cli", action="store_true",
                        help="also consume with `rollouts stream -o FILE` (the last batch size)")
    parser.add_argument("--long", action="store_true",
                        help="consumer in its own process; RSS at 10/50/100%%, kept state, carries")
    parser.add_argument("--pipelined", action="store_true",
                        help="--long: the consumers ack with ack(wait=False) (one ack in flight)")
    parser.add_argument("--page-size", type=int, default=128, help="stream page size (--long)")
    parser.add_argument("--baseline-n", type=int, default=20_000,
                        help="rollouts of each Taskset.run the --long stream is compared with")
    args = parser.parse_args()
    if args.page_size < 1:
        parser.error("--page-size: use a whole number of groups >= 1")
    _memtrace.start()
    with private_home() as home:
        asyncio.run(main(args))
        print(f"server home {home} (benchmarks/stream_histories.py --home {home} reads the batch's "
              "histories)", flush=True)
