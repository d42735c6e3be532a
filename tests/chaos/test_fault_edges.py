"""Small, fast checks of the fixes the chaos matrix led to (no Temporal needed)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from chaos_cells import CuttingProxy, _start_env_server
from faults import maybe_crash

from durable_rollouts.errors import ConnectionLostError
from durable_rollouts.sdk.client import connect


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


def test_fault_points_are_noops_unless_armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTS_FAULTS", raising=False)
    monkeypatch.setenv("ROLLOUTS_FAULTS_DIR", str(tmp_path))
    for point in ("after_provision", "after_connect", "after_start", "after_agent", "after_grade",
                  "after_verify", "before_teardown", "after_teardown"):
        maybe_crash(point)  # would SIGKILL this very process if armed
    monkeypatch.setenv("ROLLOUTS_FAULTS", "after_grade")
    maybe_crash("after_verify")  # armed for another point only
    assert not list(tmp_path.iterdir()) and os.getpid()
