"""``malloc.keep_trimmed``: memory a worker thread freed goes back to the kernel.

Each case runs a fresh interpreter (malloc's tuning is process-wide and lasts): a thread other
than the main one (its own glibc arena, as the Rust core's threads have) mallocs 240 MiB in
64 KiB blocks, touches them, and frees all but every 64th, so the arena keeps holes it cannot
give back from its top. Without the trim thread the RSS stays; with it, it drops.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from durable_rollouts.malloc import keep_trimmed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")

_SCRIPT = textwrap.dedent("""
    import ctypes, ctypes.util, json, sys, threading, time
    from durable_rollouts.malloc import keep_trimmed
    trims = keep_trimmed(float(sys.argv[1]))
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def rss():  # MiB, from /proc (the package does not need psutil)
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:")) / 1024
    out = {"trims": trims, "before": rss()}
    def churn():
        blocks = [libc.malloc(64 * 1024) for _ in range(3840)]
        for b in blocks:
            ctypes.memset(b, 1, 64 * 1024)
        out["full"] = rss()
        for i, b in enumerate(blocks):
            if i % 64:
                libc.free(b)
    t = threading.Thread(target=churn); t.start(); t.join()
    time.sleep(1.5)
    out["after"] = rss()
    print(json.dumps(out))
""")


def _run(every_s: float) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(every_s)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_trimmed_process_gives_freed_arena_memory_back() -> None:
    trimmed = _run(0.2)
    assert trimmed["trims"] is True
    assert trimmed["full"] - trimmed["before"] > 200, trimmed  # the blocks were resident
    assert trimmed["after"] < trimmed["full"] - 150, trimmed


def test_without_the_trim_thread_the_freed_memory_stays_resident() -> None:
    """The control: the same churn with trimming off keeps its RSS, so the case above measures
    the trim and not something glibc does by itself."""
    untrimmed = _run(0)
    assert untrimmed["trims"] is False
    assert untrimmed["after"] > untrimmed["full"] - 50, untrimmed


def test_a_second_call_starts_no_second_thread() -> None:
    import threading

    first, second = keep_trimmed(30.0), keep_trimmed(30.0)
    assert first == second
    names = [t.name for t in threading.enumerate() if t.name == "rollouts-malloc-trim"]
    assert len(names) <= 1
