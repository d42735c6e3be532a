"""Long fault-injection run: the cells of ``tests/chaos`` repeated until ``--faults`` faults fired.

    python benchmarks/chaos.py --faults 1000 [--parallel 2] [--rows 2] [--cells kill@grade,cut_channel]
                               [--max-seconds S] [--outages N]

Starts its own dev server (the Temporal tests' ``DevServer`` on a temporary sqlite file) and runs
the cells round-robin, ``--parallel`` at a time, each with its own ROLLOUTS_HOME, task queue and
worker processes. One cell run = one injected fault; details vary per run (``variant``: which
message the cut hits, which checkpointed turn ``kill_mid_turn`` kills after, ...). Prints the matrix cell x {runs, lost, double-graded, leaked, wrong
reward} and the wall time; exits 1 when any cell lost, double-graded, leaked or got a wrong
reward. ``--max-seconds`` stops early (the figures say how many faults actually ran).
``--outages N`` then runs the outage cells (``tests/chaos/outage_cells.py``: the S3 bucket, on
moto's server behind a proxy, unreachable for 30 s mid-batch and mid-stream, the server SIGKILLed
mid-stream, a trainer attached) N rounds, one at a time, into the same matrix.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import with_test_helpers

with_test_helpers("chaos", "temporal", "agents")
ROOT = Path(__file__).resolve().parent.parent
os.environ["ROLLOUTS_HOME"] = tempfile.mkdtemp(prefix="rollouts-chaos-")
os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")

from chaos_cells import CELLS, Outcome, run_matrix
from moto_s3 import S3Server
from outage_cells import OUTAGE_CELLS, OutageProxy, run_outage_cell
from temporal_helpers import DevServer


def print_matrix(outcomes: list[Outcome], wall: float) -> bool:
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0.0])
    for o in outcomes:
        row = table[o.cell]
        row[0] += 1
        row[1] += o.lost
        row[2] += o.double
        row[3] += o.leaked
        row[4] += o.wrong
        row[5] += o.seconds
    print(f"\n{'cell':<26}{'runs':>6}{'lost':>6}{'double':>8}{'leaked':>8}{'wrong':>7}{'mean s':>8}")
    total = [0, 0, 0, 0, 0]
    for cell in [*CELLS, *OUTAGE_CELLS]:
        if cell not in table:
            continue
        r = table[cell]
        print(f"{cell:<26}{int(r[0]):>6}{int(r[1]):>6}{int(r[2]):>8}{int(r[3]):>8}{int(r[4]):>7}{r[5] / r[0]:>8.1f}")
        for i in range(5):
            total[i] += int(r[i])
    print(f"{'TOTAL':<26}{total[0]:>6}{total[1]:>6}{total[2]:>8}{total[3]:>8}{total[4]:>7}")
    print(f"faults injected: {total[0]}  wall: {wall:.0f}s  ({wall / max(total[0], 1):.1f}s per fault)")
    return not any(total[1:])


async def main_async(args: argparse.Namespace) -> int:
    from durable_rollouts.temporal.connection import connect_client

    cells = args.cells.split(",") if args.cells else CELLS
    if os.geteuid() != 0 and "disk_full" in cells:
        cells = [c for c in cells if c != "disk_full"]
        print("not root: skipping disk_full (needs a tmpfs mount)")
    work = Path(tempfile.mkdtemp(prefix="chaos-work-"))
    server = DevServer(work / "temporal.db")
    server.start()
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    try:
        client = await connect_client(server.address)
        jobs = [(cells[i % len(cells)], i // len(cells)) for i in range(args.faults)]

        def report(out: Outcome) -> None:
            outcomes.append(out)
            flag = "ok " if out.ok else "BAD"
            print(f"[{len(outcomes):>4} {time.monotonic() - t0:6.0f}s] {flag} {out}", flush=True)
            if out.ok and out.home is not None:
                shutil.rmtree(out.home, ignore_errors=True)

        await run_matrix(jobs, client, server.address, work, lanes=args.parallel, rows=args.rows,
                         timeout=args.timeout, report=report,
                         deadline=t0 + args.max_seconds if args.max_seconds else None)
        if args.outages:
            await run_outages(args.outages, server.address, work, report)
    finally:
        server.stop()
    ok = print_matrix(outcomes, time.monotonic() - t0)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


async def run_outages(rounds: int, address: str, work: Path, report: Any) -> None:
    """The outage cells, ``rounds`` times each, one at a time (a bucket outage hits every cell on it)."""
    s3 = S3Server(work / "moto.log")
    proxy = OutageProxy(s3.port)
    proxy.start()
    saved = dict(os.environ)
    os.environ.update(s3.aws_env(), AWS_ENDPOINT_URL=proxy.url,
                      ROLLOUTS_STORAGE=f"s3://{s3.new_bucket()}/outages")
    try:
        for _ in range(rounds):
            for cell in OUTAGE_CELLS:
                report(await run_outage_cell(cell, address, work, proxy=proxy))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proxy.close()
        s3.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=1000, help="total injected faults (cell runs)")
    parser.add_argument("--parallel", type=int, default=2, help="cells running at once")
    parser.add_argument("--rows", type=int, default=2, help="rollouts per cell batch")
    parser.add_argument("--cells", default="", help="comma-separated subset of cells")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per batch")
    parser.add_argument("--max-seconds", type=float, default=0.0, help="stop starting cells after this")
    parser.add_argument("--outages", type=int, default=0, help="rounds of the outage cells afterwards")
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
