"""examples/grpo_numpy end to end: a real policy learns from the stream, across a trainer SIGKILL.

``train.py`` runs on the session's dev server with a real ``rollouts worker`` process and a real
trainer process that it SIGKILLs after step 8 and starts again. The example's own checks must
pass, the reward must rise by a margin, and the batch's history must agree: every group
acknowledged exactly once (the ack ranges tile the delivery list), and no rollout started twice.
The plain PNG writer (used without matplotlib) is checked on its own.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from durable_rollouts.workflows import workflow_id

pytest.importorskip("numpy", reason="examples/grpo_numpy needs numpy: pip install '.[grpo]'")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_numpy"
ROWS, GROUP = 96, 4


async def _histories(client, wid: str) -> list:
    """The history of every run of ``wid``, newest first (a long batch continues as new)."""
    histories, run_id = [], None
    while True:
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        histories.append(history)
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return histories


def _acks_and_children(histories: list) -> tuple[list[tuple[int, int]], list[str]]:
    acks, children = [], []
    for history in histories:
        for event in history.events:
            if event.HasField("workflow_execution_update_accepted_event_attributes"):
                request = event.workflow_execution_update_accepted_event_attributes.accepted_request
                if request.input.name == "stream_ack":
                    body = json.loads(request.input.args.payloads[0].data)
                    acks.append((body["start"], body["end"]))
            elif event.HasField("start_child_workflow_execution_initiated_event_attributes"):
                children.append(event.start_child_workflow_execution_initiated_event_attributes.workflow_id)
    return acks, children


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_the_policy_learns_across_a_trainer_sigkill_and_no_group_is_lost_or_applied_twice(
        client, dev_server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--temporal", dev_server.address,
                           "--out", str(out), "--kill-after-step", "8", "--timeout", "200",
                           "--rows", str(ROWS), "--group", str(GROUP)],
                          capture_output=True, text=True, timeout=230)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"] == {name: True for name in summary["checks"]}, proc.stdout
    assert summary["killed"]["returncode"] == -9 and summary["killed"]["after_step"] == 8
    assert summary["steps"] == ROWS // 4
    # Learning: a uniform guess scores 0.2; the last quarter of the steps beats the first.
    assert summary["last_quarter"] >= summary["first_quarter"] + 0.15, proc.stdout
    # The trainer's checkpoint: each group applied once; the restart re-read only what was unacked.
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    applied = [g for step in checkpoint["steps"] for g in step["groups"]]
    assert len(applied) == len(set(applied)) == ROWS
    assert len({step["pid"] for step in checkpoint["steps"]}) == 2
    assert len(summary["redelivered"]) <= 4  # at most the one batch the killed trainer held
    # The batch's own history: the ack ranges tile [0, ROWS) once, and no rollout started twice.
    histories = await _histories(client, workflow_id(summary["job_id"]))
    acks, children = _acks_and_children(histories)
    ranges = sorted(set(acks))
    assert len(ranges) == len(acks), f"an ack was recorded twice: {acks}"
    assert ranges[0][0] == 0 and ranges[-1][1] == ROWS
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges
    resampled = summary["stream_counts"].get("stale_resampled", 0)
    assert len(children) == len(set(children)) == (ROWS + resampled) * GROUP
    assert (out / "reward.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert seconds < 120, f"the example took {seconds:.0f} s (budget: 2 minutes on 2 cores)"


def test_the_plain_png_writer_draws_the_curve_and_the_restart(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if matplotlib were not installed
    spec = importlib.util.spec_from_file_location("grpo_example_plot", EXAMPLE / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    path = tmp_path / "reward.png"
    assert plot.plot_rewards([0.2, 0.4, 0.9, 1.0], path, restart_after=2, guess=0.2) == "plain"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    idat = data.index(b"IDAT")
    raw = zlib.decompress(data[idat + 4:idat + 4 + int.from_bytes(data[idat - 4:idat], "big")])
    assert len(raw) == height * (1 + 3 * width)
    rows = [raw[y * (1 + 3 * width) + 1:(y + 1) * (1 + 3 * width)] for y in range(height)]
    colours = {bytes(row[x * 3:x * 3 + 3]) for row in rows for x in range(width)}
    assert bytes(plot.LINE) in colours and bytes(plot.RED) in colours
    # The last point (reward 1.0, at the right edge) is drawn at the top of the chart.
    x, y = plot.WIDTH - plot.MARGIN, plot.MARGIN
    assert bytes(rows[y][x * 3:x * 3 + 3]) == bytes(plot.LINE)
