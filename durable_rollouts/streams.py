"""Streams shared by the env server and the client, neither of which imports the other.

``pipe`` copies bytes between two streams (the server's tunnels, the client's forwarders).
``open_stream`` is ``asyncio.open_connection`` with one shortcut: a server that registered its
address here (``register_local``) is reached from its own event loop over a socket pair, so an
in-process environment costs no TCP connect and accept per rollout, while the same server still
listens on TCP for everyone else. The bytes, frames and handlers are the same either way.
Imports only the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

__all__ = ["StreamPair", "open_stream", "pipe", "register_local", "unregister_local"]

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connector = Callable[[], Awaitable[StreamPair]]

# (host, port) -> (the loop serving it, how to open a stream to it on that loop)
_LOCAL: dict[tuple[str, int], tuple[asyncio.AbstractEventLoop, Connector]] = {}


def register_local(host: str, port: int, connector: Connector) -> None:
    """Let ``open_stream(host, port)`` on the running loop call ``connector`` instead of TCP."""
    _LOCAL[(host, port)] = (asyncio.get_running_loop(), connector)


def unregister_local(host: str, port: int, connector: Connector) -> None:
    """Undo ``register_local`` (only if ``connector`` still owns the address)."""
    entry = _LOCAL.get((host, port))
    if entry is not None and entry[1] == connector:
        del _LOCAL[(host, port)]


async def open_stream(host: str, port: int) -> StreamPair:
    """A stream to ``host:port``: a socket pair to a server of this very loop, else TCP."""
    entry = _LOCAL.get((host, port))
    if entry is not None and entry[0] is asyncio.get_running_loop():
        return await entry[1]()
    return await asyncio.open_connection(host, port)


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
