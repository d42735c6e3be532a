"""Byte pipes between asyncio streams, shared by the server's tunnels and the client's forwarders.

Imports only asyncio; used by ``envserver.tunnel`` and ``sdk.client`` (neither imports the other).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["pipe"]

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(65536):
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof():
        with contextlib.suppress(OSError, RuntimeError):
            dst.write_eof()


async def pipe(a: StreamPair, b: StreamPair) -> None:
    """Copy bytes both ways (half-closing on EOF) until both directions end or one breaks."""
    tasks = [asyncio.create_task(_copy(a[0], b[1])), asyncio.create_task(_copy(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, writer in (a, b):
            writer.close()
