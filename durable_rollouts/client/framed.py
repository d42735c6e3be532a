"""One framed control-channel connection of the client: send a JSON-RPC frame, read the next.

The sans-I/O ``protocol.LineProtocol`` does the framing; this wraps it around an asyncio stream
(``streams.open_stream``: a TCP connection, or an in-process one).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, ConnectionLostError, ProtocolError
from ..protocol import ErrorCode, FrameError, LineProtocol
from ..streams import open_stream

__all__ = ["FramedStream", "parse_url"]


def parse_url(url: str) -> tuple[str, int]:
    """``tcp://host:port`` -> ``(host, port)``; raises ``ConfigError`` for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or not parts.port:
        raise ConfigError(f"expected a tcp://host:port url, got {url!r}")
    return parts.hostname, parts.port


class FramedStream:
    """One framed connection: send a frame, read the next frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.proto = LineProtocol()
        self._events: list[dict[str, Any] | FrameError] = []

    @classmethod
    async def open(cls, host: str, port: int) -> FramedStream:
        reader, writer = await open_stream(host, port)
        return cls(reader, writer)

    async def send(self, frame: dict[str, Any]) -> None:
        self.proto.send(frame)
        self.writer.write(self.proto.data_to_send())
        await self.writer.drain()

    async def receive(self) -> dict[str, Any]:
        while not self._events:
            if self.proto.eof or self.proto.broken:
                raise ConnectionLostError("the control channel closed")
            data = await self.reader.read(65536)
            if data:
                self.proto.receive_data(data)
            else:
                self.proto.receive_eof()
                tail = self.proto.events_received()
                if any(isinstance(e, FrameError) for e in tail):
                    # an unterminated, unparsable last line: the connection was cut mid-frame
                    # (a transport failure to retry, not a bad frame the server meant to send)
                    raise ConnectionLostError("the control channel closed mid-frame")
                self._events.extend(tail)
            self._events.extend(self.proto.events_received())
        event = self._events.pop(0)
        if isinstance(event, FrameError):
            raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"bad frame from server: {event.message}")
        return event

    def close(self) -> None:
        self.writer.close()
