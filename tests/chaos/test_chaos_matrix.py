"""Fault-injection matrix (short version): each cell = a 2-rollout durable batch + one fault.

Real worker processes, real env subprocesses, a real dev server. Per cell: 0 rollouts lost,
0 graded twice (env-side grade logs), 0 substrates leaked (dirs and live env servers by
ROLLOUTS_HOME), rewards right. The cells are independent (own ROLLOUTS_HOME, task queue and
workers), so the session runs them ``LANES`` at a time once and each test checks its cell.
The long version is ``benchmarks/chaos.py``.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from chaos_cells import CELLS, HEARTBEAT, Outcome, run_matrix

from durable_rollouts.temporal.connection import connect_client

LANES = int(os.environ.get("ROLLOUTS_CHAOS_LANES", "3"))
# the slowest cell first, so it overlaps with the others
ORDER = ["sigstop_worker", "disk_full", *[c for c in CELLS if c not in ("sigstop_worker", "disk_full")]]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def matrix(dev_server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    work = tmp_path_factory.mktemp("chaos")
    cells = [c for c in ORDER if c != "disk_full" or os.geteuid() == 0]

    async def go() -> list[Outcome]:
        client = await connect_client(dev_server.address)
        return await run_matrix([(c, 0) for c in cells], client, dev_server.address, work,
                                lanes=LANES, rows=2, timeout=150)

    with pytest.MonkeyPatch.context() as env, ThreadPoolExecutor(1) as pool:
        env.setenv("ROLLOUTS_AGENT_HEARTBEAT", HEARTBEAT)  # read as each cell's batch starts
        outcomes = pool.submit(asyncio.run, go()).result()  # its own loop: cells outlive no test's
    return {o.cell: o for o in outcomes}


@pytest.mark.parametrize("cell", CELLS)
def test_cell(cell: str, matrix: dict[str, Outcome]) -> None:
    if cell == "disk_full" and os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    out = matrix[cell]
    assert out.ok, str(out)
