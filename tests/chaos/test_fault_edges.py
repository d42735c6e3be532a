"""Small, fast checks of the fixes the chaos matrix led to (no Temporal needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from chaos_cells import TEMPORAL_TESTS, CuttingProxy, _start_env_server

from durable_rollouts.client.envclient import connect
from durable_rollouts.errors import ConnectionLostError


async def test_reply_cut_mid_frame_is_a_lost_connection_not_a_bad_frame(tmp_path: Path) -> None:
    """A reply cut off mid-line is a transport failure (retried), never a ProtocolError (which
    the grade step turns into a final 'grading was refused' result)."""
    server, port = _start_env_server(tmp_path)
    proxy = CuttingProxy(port, b'"tasks.start"', mode="response")
    await proxy.start()
    try:
        client = await connect(f"tcp://127.0.0.1:{proxy.port}", ready_timeout=30)
        with pytest.raises(ConnectionLostError, match="mid-frame"):
            await client.start_task("echo", {"expected": "x"})
        await client.close()
        assert proxy.fired
    finally:
        await proxy.close()
        server.send_signal(signal.SIGKILL)
        server.wait(10)


POINTS = ("after_provision", "after_connect", "after_start", "after_agent", "after_grade",
          "after_verify", "before_teardown", "after_teardown")


def _reach(points: tuple[str, ...], evidence: Path, armed: str | None) -> subprocess.CompletedProcess:
    """A fresh process that reaches ``points`` in order, then prints ``survived``."""
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUTS_FAULTS"}
    env.update(ROLLOUTS_FAULTS_DIR=str(evidence), PYTHONPATH=str(TEMPORAL_TESTS))
    if armed is not None:
        env["ROLLOUTS_FAULTS"] = armed
    code = f"from faults import maybe_crash\nfor p in {points!r}: maybe_crash(p)\nprint('survived')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_fault_points_are_noops_unless_armed(tmp_path: Path) -> None:
    """Unarmed (or armed elsewhere) points do nothing; an armed point SIGKILLs the process once,
    leaving ``<point>.fired`` with its pid, and is a no-op for every later process."""
    for armed in (None, "after_grade"):
        points = POINTS if armed is None else tuple(p for p in POINTS if p != armed)
        quiet = _reach(points, tmp_path, armed)
        assert (quiet.returncode, quiet.stdout.strip()) == (0, "survived"), quiet.stderr
        assert list(tmp_path.iterdir()) == []
    killed = _reach(POINTS, tmp_path, "after_grade, after_teardown")
    assert killed.returncode == -signal.SIGKILL and "survived" not in killed.stdout
    assert [f.name for f in tmp_path.iterdir()] == ["after_grade.fired"]
    assert (tmp_path / "after_grade.fired").read_text().isdigit()
    again = _reach(("after_grade",), tmp_path, "after_grade")  # fired already: once only
    assert (again.returncode, again.stdout.strip()) == (0, "survived"), again.stderr
