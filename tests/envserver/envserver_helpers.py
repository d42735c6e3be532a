"""Helpers for envserver tests: a small test environment and a raw JSON-RPC socket."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

from durable_rollouts.envserver import Environment
from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT


class RawConn:
    """A bare socket speaking newline JSON, so tests control every byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._id = 0

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, frame: dict[str, Any]) -> None:
        await self.send_bytes(json.dumps(frame).encode() + b"\n")

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), timeout)
        assert line, "server closed the connection"
        return json.loads(line)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        await self.send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}})
        reply = await self.recv()
        assert reply["id"] == self._id
        return reply

    async def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.call(method, params)
        assert "result" in reply, reply
        return reply["result"]

    async def error_code(self, method: str, params: dict[str, Any] | None = None) -> int:
        reply = await self.call(method, params)
        assert "error" in reply, reply
        return reply["error"]["code"]

    async def closed_by_server(self, timeout: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(), timeout) == b""

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def make_env(log: list[str] | None = None) -> Environment:
    """A test environment whose tasks record what ran into ``log``."""
    events = log if log is not None else []
    env = Environment(name="testenv", version="2.0.0")

    @env.template(description="Count a letter.")
    async def count(word: str = "banana", letter: str = "a"):
        events.append(f"start:{word}")
        try:
            answer = yield f"count {letter} in {word}"
            events.append(f"grade:{answer}")
            yield 1.0 if str(word.count(letter)) == str(answer) else 0.0
        finally:
            events.append(f"teardown:{word}")

    @env.template()
    async def typed(n: int, items: list[int] | None = None, flag: bool = False):
        answer = yield {"prompt": "typed", "got": [n, items, flag]}
        yield {"score": 0.5, "subscores": [{"name": "a", "value": 1.0}], "extra": answer}

    @env.template()
    async def noscore():
        yield "say anything"

    @env.template()
    async def badscore():
        yield "p"
        yield "not a number"

    @env.template()
    async def boom(when: str = "start"):
        if when == "start":
            raise RuntimeError("exploded at start")
        yield "p"
        raise RuntimeError("exploded at grade")

    @env.template()
    async def kw(**extra: Any):
        yield {"prompt": "kw", "extra": extra}
        yield 1

    return env


def read_port(proc: subprocess.Popen[str], timeout: float = 15.0) -> int:
    """The port a served env process announces on stdout (fails with its stderr)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(SERVE_PORT_ANNOUNCEMENT):
            return int(line[len(SERVE_PORT_ANNOUNCEMENT):])
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no port announced; stderr: {proc.stderr.read() if proc.stderr else ''}")
