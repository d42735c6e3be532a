"""Serve one ssh session's command as a local process: pipes, timeout, hang-up, kill.

:func:`run_session` spawns the command in its own process group, copies the session's stdin and
the command's stdout/stderr both ways, and kills the whole group when the command outlives its
timeout (exit status :data:`TIMEOUT_EXIT_STATUS`) or the client goes away, so nothing is left
running. What the command runs in (sandbox or not) is the caller's business.

Imports asyncssh only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import asyncssh

from ..processes import kill_session

__all__ = ["TIMEOUT_EXIT_STATUS", "run_session"]

TIMEOUT_EXIT_STATUS = 124
PIPE_CHUNK = 65536
DRAIN_TIMEOUT_S = 2


async def run_session(
    process: asyncssh.SSHServerProcess[bytes],
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: dict[str, str],
    timeout_s: float,
    running: set[asyncio.subprocess.Process],
) -> None:
    """Run ``argv`` for ``process`` and exit the session with its status.

    The process is in ``running`` while it runs, so its owner can kill it at shutdown.
    """
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
    ))
    try:
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:  # the session went away while the command was starting
        with contextlib.suppress(BaseException):
            kill_session((await spawn).pid)
        raise
    except OSError as exc:
        process.stderr.write(f"cannot start command: {exc}\n".encode())
        process.exit(127)
        return
    running.add(proc)
    assert proc.stdin and proc.stdout and proc.stderr
    feed = asyncio.create_task(_pump(process.stdin, proc.stdin, close=True))
    outs = [asyncio.create_task(_pump(proc.stdout, process.stdout)),
            asyncio.create_task(_pump(proc.stderr, process.stderr))]
    exited = asyncio.create_task(proc.wait())
    hangup = asyncio.create_task(process.channel.wait_closed())
    try:
        await asyncio.wait({exited, hangup}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():  # timed out, or the client went away: no orphans either way
            kill_session(proc.pid)
            await exited
            if hangup.done():
                for task in outs:
                    task.cancel()
                return
            note = f"\ncommand killed after {timeout_s:g}s timeout\n"
            process.stderr.write(note.encode())
            status = TIMEOUT_EXIT_STATUS
        else:
            status = exited.result()
    finally:
        running.discard(proc)
        if proc.returncode is None:
            kill_session(proc.pid)
        for task in (feed, hangup, exited):
            task.cancel()
    # Drain what the command wrote; a background child holding the pipes open is not waited for.
    await asyncio.wait(outs, timeout=DRAIN_TIMEOUT_S)
    for task in outs:
        task.cancel()
    process.exit(status if status >= 0 else 128 - status)


async def _pump(
    source: asyncio.StreamReader | asyncssh.SSHReader[bytes],
    sink: asyncio.StreamWriter | asyncssh.SSHWriter[bytes],
    *,
    close: bool = False,
) -> None:
    """Copy ``source`` to ``sink`` until EOF or either side breaks; then ``close`` the sink."""
    try:
        while data := await source.read(PIPE_CHUNK):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncssh.Error, asyncssh.BreakReceived, asyncssh.SignalReceived,
            asyncssh.TerminalSizeChanged):
        pass
    finally:
        if close:
            with contextlib.suppress(Exception):
                sink.close()
