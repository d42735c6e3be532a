"""Outage cells of the fault matrix (``tests/chaos/outage_cells.py``): the S3 bucket unreachable
for 30 s mid-batch and mid-stream, and the Temporal server SIGKILLed and restarted mid-stream,
each with real worker processes and (for the stream cells) a trainer process attached.

Per cell: the batch completes, no rollout lost or graded twice, the trainer applies every group
exactly once, no substrate leaked. The totals (faults injected, lost, doubled, leaked) are printed.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from outage_cells import OUTAGE_CELLS, OutageProxy, run_outage_cell

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def outages(dev_server, s3_server, tmp_path_factory: pytest.TempPathFactory):
    bucket = s3_server.new_bucket()
    saved = dict(os.environ)
    work = tmp_path_factory.mktemp("outages")

    async def go() -> tuple[list, int]:
        proxy = OutageProxy(s3_server.port)
        proxy.start()
        os.environ.update(s3_server.aws_env(), AWS_ENDPOINT_URL=proxy.url,
                          ROLLOUTS_STORAGE=f"s3://{bucket}/outages")
        try:
            found = [await run_outage_cell(cell, dev_server.address, work, proxy=proxy)
                     for cell in OUTAGE_CELLS]
        finally:
            proxy.close()
        return found, proxy.outages

    try:
        with ThreadPoolExecutor(1) as pool:  # its own loop: the proxy and cells outlive no test's loop
            outcomes, outages = pool.submit(asyncio.run, go()).result()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {o.cell: o for o in outcomes}, outages


def test_outage_totals_are_printed_and_clean(outages, capsys: pytest.CaptureFixture[str]) -> None:
    """One fault per cell; the table of the fault matrix's outage cells and its totals."""
    by_cell, bucket_outages = outages
    rows = [f"{'cell':24} {'rollouts':>8} {'lost':>5} {'doubled':>7} {'leaked':>6} {'wrong':>5} {'s':>6}"]
    for o in by_cell.values():
        rows.append(f"{o.cell:24} {o.rows:8} {o.lost:5} {o.double:7} {o.leaked:6} {o.wrong:5} {o.seconds:6.1f}  "
                    + "; ".join(o.notes))
    total = list(by_cell.values())
    rows.append(f"totals: faults injected {len(total)} (bucket outages {bucket_outages}), "
                f"lost {sum(o.lost for o in total)}, doubled {sum(o.double for o in total)}, "
                f"leaked {sum(o.leaked for o in total)}, wrong {sum(o.wrong for o in total)}")
    with capsys.disabled():
        print("\n" + "\n".join(rows))
    assert bucket_outages == 2


@pytest.mark.parametrize("cell", OUTAGE_CELLS)
def test_outage_cell(cell: str, outages) -> None:
    """The batch completes with nothing lost, doubled, leaked or wrong; the trainer applied every
    group exactly once."""
    out = outages[0][cell]
    assert out.ok, str(out)
