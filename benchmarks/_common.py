"""Shared set-up of the benchmarks: a private ROLLOUTS_HOME, the embedded server, tasks, RSS.

Benchmarks stay out of pytest. Each run uses a fresh ``ROLLOUTS_HOME`` (a new sqlite file), starts
the embedded dev server exactly as ``rollouts run`` does, and stops it at the end.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LETTERS = str(ROOT / "examples" / "letters" / "env.py")


def with_test_helpers(*folders: str) -> None:
    """Make the helper modules of ``tests/<folder>`` importable, for this benchmark and the worker
    processes it starts: without them on PYTHONPATH, the script starts itself once more with
    them there (how the tests hand them to their subprocesses), instead of editing sys.path."""
    search = os.pathsep.join(str(ROOT / "tests" / folder) for folder in folders)
    if not os.environ.get("PYTHONPATH", "").startswith(search):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (search, os.environ.get("PYTHONPATH")) if p)
        os.execv(sys.executable, sys.orig_argv)


@contextmanager
def private_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="rollouts-bench-"))
    os.environ["ROLLOUTS_HOME"] = str(home)
    os.environ.pop("ROLLOUTS_TEMPORAL_ADDRESS", None)
    try:
        yield home
    finally:
        from durable_rollouts.temporal.connection import stop_dev_server

        stop_dev_server(home)


def letter_tasks(n: int) -> list:
    from durable_rollouts.models import Task

    return [Task(env="letters", id="count_letter", args={"word": f"w{i}rr", "letter": "r"}, source=LETTERS)
            for i in range(n)]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The sized fields of ``/proc/PID/status`` (VmRSS, VmHWM, RssAnon, ...), in kB; {} without
    /proc."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0])
    return fields


def peak_mb(pid: int | str = "self") -> float:
    """A process's peak RSS (VmHWM) in MiB, which a bench may reset per phase; nan without /proc."""
    kb = proc_status(pid).get("VmHWM")
    return float("nan") if kb is None else kb / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def event_seconds(event: Any) -> float:
    """A history event's time, in seconds since the epoch."""
    return event.event_time.ToMicroseconds() / 1e6


@asynccontextmanager
async def home_client(home: Path) -> AsyncIterator[Any]:
    """A client of a finished run's dev server, started again on that home's sqlite file (the
    history readers: ``stream_histories.py``, ``batch_histories.py``); stopped on the way out."""
    os.environ["ROLLOUTS_HOME"] = str(home)
    os.environ.pop("ROLLOUTS_TEMPORAL_ADDRESS", None)
    from durable_rollouts.temporal.connection import connect_client, ensure_dev_server, stop_dev_server

    server = await ensure_dev_server(home, ui=False)
    try:
        yield await connect_client(server.address)
    finally:
        stop_dev_server(home)
