"""Process control, the one place that signals processes: liveness, signalling a process or the
group it leads, and stopping one (TERM, a grace period, then KILL).

Shared by every layer (the env server's command sessions and bash grader, the subprocess provider,
the embedded Temporal server), so it imports nothing of ours. Stopping is written once as a
sequence of pauses (:func:`_stop_sequence`) that a blocking and an asyncio caller each drive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["KILL_WAIT_S", "kill_session", "pid_alive", "signal_process", "stop_process",
           "stop_process_async"]

POLL_S = 0.02
KILL_WAIT_S = 2.0  # after SIGKILL, how long a stop waits for the process to be gone


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (exited but not yet reaped counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def signal_process(pid: int, sig: int = signal.SIGKILL, *, pgid: int = 0) -> None:
    """Send ``sig`` to process group ``pgid``, or to ``pid`` alone when ``pgid`` is 0, 1 or our
    own group (never signal ourselves by accident). A process already gone, or not ours, is fine."""
    if pgid <= 1 or pgid == os.getpgrp():
        pgid = 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)


def kill_session(pid: int) -> None:
    """SIGKILL the whole group that ``pid`` leads (a child started with ``start_new_session``):
    a shell and whatever it started."""
    signal_process(pid, signal.SIGKILL, pgid=pid)


def _stop_sequence(pid: int, pgid: int, grace_s: float,
                   alive: Callable[[int], bool]) -> Iterator[float]:
    """SIGTERM, up to ``grace_s`` for ``alive(pid)`` to turn False, SIGKILL (the group's stragglers
    too, when ``pgid`` is given), up to ``KILL_WAIT_S`` more; yields each pause to sleep."""
    signal_process(pid, signal.SIGTERM, pgid=pgid)
    for wait_s, then in ((grace_s, signal.SIGKILL), (KILL_WAIT_S, None)):
        deadline = time.monotonic() + wait_s
        while alive(pid) and time.monotonic() < deadline:
            yield POLL_S
        if then is not None and (pgid or alive(pid)):
            signal_process(pid, then, pgid=pgid)


def stop_process(pid: int, *, pgid: int = 0, grace_s: float = 3.0,
                 alive: Callable[[int], bool] = pid_alive) -> None:
    """Stop ``pid`` (and group ``pgid``): TERM, ``grace_s`` to exit, then KILL. Blocks."""
    for pause in _stop_sequence(pid, pgid, grace_s, alive):
        time.sleep(pause)


async def stop_process_async(pid: int, *, pgid: int = 0, grace_s: float = 3.0,
                             alive: Callable[[int], bool] = pid_alive) -> None:
    """:func:`stop_process` for the event loop (it keeps running while the process exits)."""
    for pause in _stop_sequence(pid, pgid, grace_s, alive):
        await asyncio.sleep(pause)
