"""Where a long-running worker's memory goes: a sampler thread that writes one JSON line a minute.

Set ``BENCH_MEMTRACE=FILE`` (and optionally ``BENCH_MEMTRACE_EVERY=S``) before a bench starts; the
bench calls :func:`start`. Each line holds the process's RSS and peak RSS (VmHWM; a bench resets it per phase), what Python's allocator holds
(``sys.getallocatedblocks``), what glibc's malloc holds in use and free in its arenas
(``mallinfo2``: Rust core and C extensions allocate there, pymalloc's small objects do not), the
live objects the collector tracks, the thread count, and every fifth line the 12 most common
object types. A Python heap that stays flat while RSS climbs points at native memory; arenas'
free bytes that climb point at fragmentation rather than a leak.

Once the embedded server runs (``ROLLOUTS_HOME/temporal.json``), each line also holds the
server's RSS split into anonymous, file-backed and shared pages (``/proc``) and, from its
``/metrics`` endpoint, the Go heap (in use, idle, released), goroutines and the history service's
cache usage: whether a growing server holds live objects, pages it has not returned, or the
sqlite file mapped.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import gc
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
from _common import peak_mb, proc_status


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return None
    return libc


def _mallinfo() -> dict[str, int]:
    libc = _libc()
    if libc is None:
        return {}
    info = libc.mallinfo2()
    mib = 1 << 20
    return {"malloc_in_use_mib": round((info.uordblks + info.hblkhd) / mib, 1),
            "malloc_free_mib": round(info.fordblks / mib, 1)}


_GO_GAUGES = ("memory_heap", "memory_heapinuse", "memory_heapidle", "memory_heapreleased",
              "memory_stack", "num_goroutines")


class _Server:
    """The embedded server of this bench's ``ROLLOUTS_HOME``, found once it has started."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.metrics: str | None = None

    def _find(self) -> None:
        try:
            info = json.loads((Path(os.environ["ROLLOUTS_HOME"]) / "temporal.json").read_text())
            ports = {c.laddr.port for c in psutil.Process(info["pid"]).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN} - {info.get("port"), info.get("ui_port")}
        except (KeyError, OSError, ValueError, psutil.Error):
            return
        self.pid = info["pid"]
        for port in sorted(ports):
            url = f"http://127.0.0.1:{port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if b"memory_heap" in reply.read():
                        self.metrics = url
                        return
            except OSError:
                continue

    def sample(self) -> dict:
        if self.pid is None or self.metrics is None:
            self._find()
        if self.pid is None:
            return {}
        line: dict = {f"server_{key}_mib": round(kb / 1024, 1)
                      for key, kb in proc_status(self.pid).items()
                      if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")}
        if not line:  # the server is gone
            return {}
        if self.metrics is not None:
            try:
                with urllib.request.urlopen(self.metrics, timeout=5) as reply:
                    text = reply.read().decode()
            except OSError:
                return line
            for row in text.splitlines():
                name, _, value = row.rpartition(" ")
                base = name.partition("{")[0]
                if base in _GO_GAUGES and 'service_name="history"' in name:
                    scale = 1 if base == "num_goroutines" else 1 << 20
                    line[f"server_{base}"] = round(float(value) / scale, 1)
                elif base == "cache_usage" and 'service_name="history"' in name:
                    kind = name.partition('cache_type="')[2].partition('"')[0]
                    line[f"server_cache_{kind}"] = float(value)
        return line


def _sample(me: psutil.Process, t0: float, n: int) -> dict:
    line = {"t_s": round(time.monotonic() - t0), "rss_mib": round(me.memory_info().rss / (1 << 20), 1),
            "hwm_mib": round(peak_mb(), 1),
            "py_blocks": sys.getallocatedblocks(), "threads": threading.active_count(),
            "os_threads": me.num_threads(), **_mallinfo()}
    objects = gc.get_objects()
    line["gc_objects"] = len(objects)
    if n % 5 == 0:
        line["top"] = collections.Counter(type(o).__name__ for o in objects).most_common(12)
    del objects
    return line


def start() -> None:
    """Start the sampler if ``BENCH_MEMTRACE`` names a file; a no-op otherwise."""
    path = os.environ.get("BENCH_MEMTRACE")
    if not path:
        return
    every = float(os.environ.get("BENCH_MEMTRACE_EVERY", "60"))

    def loop() -> None:
        me, t0, n, server = psutil.Process(), time.monotonic(), 0, _Server()
        with open(path, "a") as out:
            while True:
                out.write(json.dumps({**_sample(me, t0, n), **server.sample()}) + "\n")
                out.flush()
                n += 1
                time.sleep(every)

    threading.Thread(target=loop, name="memtrace", daemon=True).start()
