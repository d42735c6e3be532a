"""Keep a long-running worker's resident memory flat: glibc malloc tuned once, trimmed regularly.

A worker of a long job climbs from ~250 to ~280 MiB over its first half hour and stays there
(issue #39). The Python heap does not grow over that climb; what grows is memory glibc's malloc
holds *free* in its arenas (measured with ``mallinfo2`` by ``benchmarks/_memtrace.py``: 22 ->
100 MiB free, 27 MiB in use). Two glibc behaviours make it so, and neither frees it by itself:

- the mmap threshold is dynamic: once a large buffer (a multi-MiB workflow history decoded by
  the Rust core, a claim-check blob) is freed, later buffers up to that size come from the arenas
  instead of ``mmap`` and stay there after they are freed;
- arenas of threads other than the main one (the core's tokio threads, the activity pool) give
  pages back only from their top, so a hole in the middle stays resident.

:func:`keep_trimmed` fixes the threshold (``mallopt(M_MMAP_THRESHOLD)``, which also turns the
dynamic one off) and starts one daemon thread that calls ``malloc_trim(0)`` every few seconds:
it hands every wholly free page of every arena back to the kernel (``MADV_DONTNEED``). ctypes
releases the GIL for the call, so the event loop does not wait on it. Hand-written because
neither temporalio nor the standard library does this, and ``MALLOC_*`` environment variables
act only at process start (a user's own script runs the in-process worker). A no-op where the C
library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

__all__ = ["MMAP_THRESHOLD", "keep_trimmed"]

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter number (glibc malloc.h)
MMAP_THRESHOLD = 256 * 1024  # larger allocations get their own mapping, unmapped when freed

_started: threading.Thread | None = None
_lock = threading.Lock()


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
            return None
    except OSError:
        return None
    return libc


def keep_trimmed(every_s: float) -> bool:
    """Tune malloc and start the trim thread, once per process (``every_s`` <= 0: do nothing).
    Returns whether this process trims (a second call, and a non-glibc system, return as the
    first did)."""
    global _started
    if every_s <= 0:
        return False
    with _lock:
        if _started is not None:
            return True
        libc = _glibc()
        if libc is None:
            return False
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)

        def trim() -> None:
            while True:
                time.sleep(every_s)
                libc.malloc_trim(0)

        _started = threading.Thread(target=trim, name="rollouts-malloc-trim", daemon=True)
        _started.start()
        log.debug("malloc: mmap threshold %d bytes, trimmed every %g s", MMAP_THRESHOLD, every_s)
        return True
