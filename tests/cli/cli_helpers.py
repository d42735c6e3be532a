"""Helpers of the CLI tests: ``rollouts`` as a real subprocess, agent configs, paths.

CLI subprocesses inherit the session's ``$ROLLOUTS_HOME`` (so they reuse the embedded dev server
of the ``embedded_server`` fixture) and get this folder on PYTHONPATH, so ``flaky_agent:FlakyAgent``
imports in them and in the workers they start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LETTERS = ROOT / "examples" / "letters" / "env.py"
ANSWERS = {"count_letter": "3", "reverse_word": "reward"}  # vowels gets "" (reward 0)


def rollouts_cmd() -> list[str]:
    script = Path(sys.executable).parent / "rollouts"
    if script.exists():
        return [str(script)]
    found = shutil.which("rollouts")
    return [found] if found else [sys.executable, "-m", "durable_rollouts.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ROLLOUTS_TEMPORAL_ADDRESS", "ROLLOUTS_TEMPORAL_UI")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def rollouts(*args: str, timeout: float = 60, cwd: Path | None = None, **env: str) -> Result:
    """Run ``rollouts ARGS`` to completion (env: extra environment variables).

    On a timeout the process gets SIGABRT (faulthandler prints every thread's stack) and the
    test fails with the tail of its stderr.
    """
    proc = subprocess.Popen(
        [*rollouts_cmd(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(PYTHONFAULTHANDLER="1", **env),
        cwd=cwd,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(
            f"rollouts {' '.join(args)} hung for {timeout}s; stderr:\n{err[-6000:]}"
        ) from None
    return Result(proc.returncode, out, err)


def flaky_config(
    tmp_path: Path,
    fail_ids: tuple[str, ...] = (),
    seconds: float = 0.0,
    fast_after_marker: bool = False,
) -> str:
    """``--agent-config`` of flaky_agent:FlakyAgent; ``tmp_path / "marker"`` fixes it, ``agent.log`` logs it."""
    return json.dumps(
        {
            "answers": ANSWERS,
            "fail_ids": list(fail_ids),
            "marker": str(tmp_path / "marker"),
            "seconds": seconds,
            "log": str(tmp_path / "agent.log"),
            "fast_after_marker": fast_after_marker,
        }
    )


def assert_one_line_error(result: Result, *needles: str) -> None:
    """Exit code 2, ONE ``error:`` line on stderr (containing every needle), no traceback."""
    assert result.code == 2, (result.code, result.out, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    assert "Traceback" not in result.err + result.out
    for needle in needles:
        assert needle in lines[0], lines[0]


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # an exited child of init not yet reaped is gone too
        return fh.read().split()[2] != "Z"
