"""`python -m durable_rollouts.envserver` as a real subprocess: announcement, signals, bad input."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from envserver_helpers import read_port

from durable_rollouts.client.envclient import connect
from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT

LETTERS = Path(__file__).resolve().parents[2] / "examples" / "letters" / "env.py"

HOOKED_ENV = """
from pathlib import Path
from durable_rollouts.envserver import Environment

env = Environment(name="hooked")
OUT = Path({out!r})

@env.initialize
async def up():
    (OUT / "initialized").write_text("yes")

@env.shutdown
async def down():
    (OUT / "shutdown").write_text("yes")

@env.template()
async def t():
    try:
        yield "p"
    finally:
        (OUT / "teardown").write_text("yes")
"""


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "durable_rollouts.envserver", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


async def test_the_letters_example_serves_and_announces_its_port(procs: list[subprocess.Popen[str]]) -> None:
    proc = _spawn(str(LETTERS))
    procs.append(proc)
    port = read_port(proc)
    async with await connect(f"tcp://127.0.0.1:{port}", ready_timeout=5) as client:
        assert client.env is not None and client.env.name == "letters"
        assert await client.start_task("count_letter", {"word": "banana", "letter": "a"})
        assert await client.grade("3") == {"score": 1.0}


async def test_sigterm_tears_down_tasks_and_runs_the_shutdown_hook(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    env_file = tmp_path / "hooked.py"
    env_file.write_text(HOOKED_ENV.format(out=str(tmp_path)))
    proc = _spawn(str(env_file))
    procs.append(proc)
    port = read_port(proc)
    assert (tmp_path / "initialized").exists()  # hooks ran before the announcement
    client = await connect(f"tcp://127.0.0.1:{port}", ready_timeout=5)
    await client.start_task("t")
    await client.close()  # parked, not torn down yet
    await asyncio.sleep(0.1)
    assert not (tmp_path / "teardown").exists()
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert (tmp_path / "teardown").exists() and (tmp_path / "shutdown").exists()


async def test_sigint_also_stops_cleanly(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    env_file = tmp_path / "hooked.py"
    env_file.write_text(HOOKED_ENV.format(out=str(tmp_path)))
    proc = _spawn(str(env_file))
    procs.append(proc)
    read_port(proc)
    proc.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert (tmp_path / "shutdown").exists()


def test_binding_beyond_loopback_without_a_token_exits_2_with_one_line(procs: list[subprocess.Popen[str]]) -> None:
    proc = _spawn(str(LETTERS), "--host", "0.0.0.0", env={"ROLLOUTS_ENV_TOKEN": ""})
    procs.append(proc)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1 and "token" in err


def test_a_missing_env_file_exits_2_without_a_traceback(procs: list[subprocess.Popen[str]]) -> None:
    proc = _spawn("/nonexistent/env.py")
    procs.append(proc)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 2 and "Traceback" not in err and "not found" in err


def test_a_failing_initialize_hook_fails_serve_naming_the_hook(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    env_file = tmp_path / "bad.py"
    env_file.write_text(
        "from durable_rollouts.envserver import Environment\n"
        "env = Environment()\n"
        "@env.initialize\n"
        "def warm_cache():\n"
        "    raise RuntimeError('cache is cold')\n"
    )
    proc = _spawn(str(env_file))
    procs.append(proc)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "warm_cache" in err and SERVE_PORT_ANNOUNCEMENT not in out and "Traceback" not in err
