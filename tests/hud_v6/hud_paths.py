"""Paths and a process helper shared by the HUD v6 tests (a module of its own, not the conftest:
every test folder has a ``conftest`` module, so importing one by that name is ambiguous)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
QUICKSTART = FIXTURES / "quickstart" / "tasks.py"
MCP_ENV = FIXTURES / "mcp_tools" / "env.py"


@contextmanager
def announced(cmd: list[str], port_line: str, cwd: Path | None = None) -> Iterator[str]:
    """Run ``cmd`` (a server printing ``<port_line><port>``) until the block ends; yields its url."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(cwd) if cwd else None, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(port_line):
                break
        else:
            raise AssertionError(f"{' '.join(cmd)} never announced its port:\n{''.join(seen)}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never blocks on a full pipe
        yield f"tcp://127.0.0.1:{int(line[len(port_line):])}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
