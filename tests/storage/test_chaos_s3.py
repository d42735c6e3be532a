"""Chaos cells on the S3 driver: the fault matrix's machinery (``tests/chaos/chaos_cells.py``)
with ROLLOUTS_STORAGE pointing at a bucket on moto's standalone server (a real HTTP S3 API).

Four cells: worker SIGKILLed after the agent (before its result is recorded), after the env
graded, after the verifier graded, and the verifier's substrate killed mid-grade. Per cell: 0
rollouts lost, 0 graded twice (env and verifier side logs), 0 substrates leaked, rewards right;
and the cells' traces are objects in the bucket, not files on a worker's disk.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from chaos_cells import HEARTBEAT, Outcome, run_matrix

CELLS = ["kill@agent", "kill@grade", "kill@verify", "kill_verifier_substrate"]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def s3_matrix(dev_server, s3_server, tmp_path_factory: pytest.TempPathFactory):
    bucket = s3_server.new_bucket()
    saved = dict(os.environ)
    os.environ.update(s3_server.aws_env(), ROLLOUTS_STORAGE=f"s3://{bucket}/chaos",
                      ROLLOUTS_AGENT_HEARTBEAT=HEARTBEAT)
    work = tmp_path_factory.mktemp("chaos-s3")

    async def go() -> list[Outcome]:
        from durable_rollouts.temporal.connection import connect_client

        client = await connect_client(dev_server.address)
        return await run_matrix([(c, 0) for c in CELLS], client, dev_server.address, work,
                                lanes=2, rows=2, timeout=150)

    try:
        with ThreadPoolExecutor(1) as pool:  # its own loop: the cells outlive no test's loop
            outcomes = pool.submit(asyncio.run, go()).result()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {o.cell: o for o in outcomes}, s3_server.objects(bucket), work


@pytest.mark.parametrize("cell", CELLS)
def test_chaos_cell_on_s3_storage(cell: str, s3_matrix) -> None:
    """The cell survives its fault with nothing lost, doubled or leaked on the S3 driver."""
    outcomes, _, _ = s3_matrix
    assert outcomes[cell].ok, str(outcomes[cell])


def test_chaos_traces_live_in_the_bucket_not_on_worker_disks(s3_matrix) -> None:
    """Every rollout's trace went to the bucket; no worker home holds a trace or result file."""
    _, objects, work = s3_matrix
    assert len([k for k in objects if k.startswith("chaos/v0/")]) >= 2 * len(CELLS)
    assert not list(work.rglob("traces/*.json")) and not list(work.rglob("storage/sha256/*"))
