"""Fixtures for the sdk tests: env files on disk and a check that no env process outlives a test."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from durable_rollouts.paths import rollouts_home

REPO = Path(__file__).resolve().parents[2]
LETTERS = REPO / "examples" / "letters" / "env.py"
VERIFIER = REPO / "examples" / "verifier"

ECHO_ENV = '''
from durable_rollouts.envserver import Environment

env = Environment(name="echo", version="0.1.0")


@env.template()
async def measure(blob: str = ""):
    answer = yield f"How long is the blob? It starts with {blob[:8]!r}."
    yield {"score": 1.0 if str(answer).strip() == str(len(blob)) else 0.0, "info": {"length": len(blob)}}


@env.template()
async def explode(when: str = "grade"):
    if when == "start":
        raise RuntimeError("explode at start")
    answer = yield "say anything"
    raise RuntimeError("explode at grade")
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def live_substrates() -> list[int]:
    """Pids of env servers whose state file is still on disk and that are still running."""
    pids = []
    for state in (rollouts_home() / "substrates").glob("*/state.json"):
        import json

        try:
            pid = int(json.loads(state.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if _alive(pid):
            pids.append(pid)
    return pids


@pytest.fixture
def letters_path() -> Path:
    return LETTERS


@pytest.fixture
def echo_path(tmp_path: Path) -> Path:
    path = tmp_path / "echo_env.py"
    path.write_text(textwrap.dedent(ECHO_ENV))
    return path


@pytest.fixture(autouse=True)
def no_leftover_env_processes():
    """Every test must stop the env servers it started (state files gone, processes dead)."""
    before = set(live_substrates())
    yield
    leftover = set(live_substrates()) - before
    for pid in leftover:  # clean up so one failure does not cascade, then fail loudly
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
    assert not leftover, f"env server processes left running: {sorted(leftover)}"
