"""Helpers for security tests: a tiny environment and a raw JSON-RPC connection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from durable_rollouts.envserver import Capability, Environment


def make_env(echo_port: int | None = None) -> Environment:
    """One task (``secret``) whose prompt names its argument; optionally an ``echo`` capability."""
    env = Environment(name="secenv", version="1.0.0")

    @env.template()
    async def secret(word: str = "x"):
        answer = yield f"guess {word}"
        yield 1.0 if answer == word else 0.0

    if echo_port is not None:
        env.add_capability(Capability(name="echo", protocol="tcp", url=f"tcp://127.0.0.1:{echo_port}"))
    return env


class Raw:
    """A bare connection so tests control every frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self._id = reader, writer, 0

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        frame = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}}
        self.writer.write(json.dumps(frame).encode() + b"\n")
        await self.writer.drain()
        line = await asyncio.wait_for(self.reader.readline(), 5)
        assert line, f"server closed the connection instead of answering {method}"
        reply = json.loads(line)
        assert reply["id"] == self._id
        return reply

    async def code(self, method: str, params: dict[str, Any] | None = None) -> int | None:
        reply = await self.call(method, params)
        return reply["error"]["code"] if "error" in reply else None

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
