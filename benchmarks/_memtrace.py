"""Where a long-running worker's memory goes: a sampler thread that writes one JSON line a minute.

Set ``BENCH_MEMTRACE=FILE`` (and optionally ``BENCH_MEMTRACE_EVERY=S``) before a bench starts; the
bench calls :func:`start`. Each line holds the process's RSS and peak RSS (VmHWM; a bench resets it per phase), what Python's allocator holds
(``sys.getallocatedblocks``), what glibc's malloc holds in use and free in its arenas
(``mallinfo2``: Rust core and C extensions allocate there, pymalloc's small objects do not), the
live objects the collector tracks, the thread count, and every fifth line the 12 most common
object types. A Python heap that stays flat while RSS climbs points at native memory; arenas'
free bytes that climb point at fragmentation rather than a leak.
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

import psutil
from _common import peak_mb


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
        me, t0, n = psutil.Process(), time.monotonic(), 0
        with open(path, "a") as out:
            while True:
                out.write(json.dumps(_sample(me, t0, n)) + "\n")
                out.flush()
                n += 1
                time.sleep(every)

    threading.Thread(target=loop, name="memtrace", daemon=True).start()
