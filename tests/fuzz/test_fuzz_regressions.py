"""Regression tests for the control-channel bugs the fuzzer found (each failed before its fix).

1. A reply carrying a lone surrogate (from an id, method name or session id echoed back) could not
   be encoded as UTF-8: the connection handler crashed and the request got no reply.
2. NaN, Infinity and out-of-range numbers (1e400) were accepted and echoed as ``NaN`` /
   ``Infinity``, which is not JSON.
3. Ids that JSON-RPC forbids (arrays, objects, booleans) were echoed and the request executed.
4. A task result that cannot be encoded (NaN inside it) crashed the connection handler.
5. ``tunnel.open`` without an id (a notification) still got an error reply.
6. The client raised KeyError / TypeError / pydantic ValidationError for a malformed ``hello`` or
   ``tasks.list`` result instead of a ``ProtocolError``.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from durable_rollouts.client.envclient import EnvClient
from durable_rollouts.client.framed import FramedStream
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import ProtocolError
from durable_rollouts.protocol import LineProtocol, encode_frame


def _strict(line: bytes) -> Any:
    def reject(name: str) -> Any:
        raise ValueError(name)

    return json.loads(line.decode("utf-8"), parse_constant=reject)


def _env() -> Environment:
    env = Environment(name="regress")

    @env.template()
    async def nan_detail():
        yield "p"
        yield {"score": 1.0, "detail": math.nan}

    @env.template()
    async def plain():
        yield "p"
        yield 1.0

    return env


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, line: bytes) -> None:
        self.writer.write(line + b"\n")
        await self.writer.drain()

    async def reply(self) -> Any:
        line = await asyncio.wait_for(self.reader.readline(), 5)
        assert line, "connection closed without a reply"
        return _strict(line)


@pytest.fixture
async def conn() -> Any:
    async with serving(_env()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        yield _Conn(reader, writer)
        writer.close()


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"tasks.list"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\udfff"}',
        b'{"jsonrpc":"2.0","id":1,"method":"hello","params":{"session_id":"\\ud800"}}',
    ],
)
async def test_lone_surrogates_echoed_in_a_reply_are_escaped_not_fatal(conn: _Conn, line: bytes) -> None:
    await conn.send(line)
    reply = await conn.reply()
    assert reply["id"] == json.loads(line)["id"]
    await conn.send(b'{"jsonrpc":"2.0","id":2,"method":"tasks.list"}')
    assert "result" in await conn.reply()  # the connection survived


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
async def test_non_json_numbers_are_parse_errors_and_never_echoed(conn: _Conn, literal: bytes) -> None:
    await conn.send(b'{"jsonrpc":"2.0","id":' + literal + b',"method":"tasks.list"}')
    reply = await conn.reply()
    assert reply["id"] is None and reply["error"]["code"] == -32700


@pytest.mark.parametrize("bad_id", [b"[1]", b'{"a":1}', b"true", b"[" * 900 + b"]" * 900])
async def test_ids_json_rpc_forbids_are_refused_without_running_the_request(conn: _Conn, bad_id: bytes) -> None:
    await conn.send(b'{"jsonrpc":"2.0","id":' + bad_id + b',"method":"bye"}')
    reply = await conn.reply()
    assert reply == {"jsonrpc": "2.0", "id": None, "error": reply["error"]} and reply["error"]["code"] == -32600
    await conn.send(b'{"jsonrpc":"2.0","id":3,"method":"tasks.list"}')
    assert "result" in await conn.reply()  # bye did not run: still connected


async def test_a_task_result_that_is_not_json_becomes_a_32603_error(conn: _Conn) -> None:
    await conn.send(b'{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"nan_detail"}}')
    assert (await conn.reply())["result"] == {"prompt": "p"}
    await conn.send(b'{"jsonrpc":"2.0","id":2,"method":"tasks.grade","params":{"answer":1}}')
    reply = await conn.reply()
    assert reply["id"] == 2 and reply["error"]["code"] == -32603
    await conn.send(b'{"jsonrpc":"2.0","id":3,"method":"tasks.list"}')
    assert "result" in await conn.reply()


async def test_a_tunnel_open_notification_gets_no_reply() -> None:
    async with serving(_env()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b'{"jsonrpc":"2.0","method":"tunnel.open","params":{"capability":"nope"}}\n')
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


def test_the_framing_layer_escapes_surrogates_and_rejects_non_json_numbers() -> None:
    line = encode_frame({"id": "\ud800"})
    assert line == b'{"id":"\\ud800"}\n'
    assert encode_frame({"s": "é"}) == '{"s":"é"}\n'.encode()  # UTF-8 stays UTF-8
    with pytest.raises(ValueError):
        encode_frame({"x": math.inf})
    proto = LineProtocol()
    proto.receive_data(b'{"x":NaN}\n{"x":1e999}\n{"x":1.5}\n')
    first, second, third = proto.events_received()
    assert getattr(first, "code", None) == -32700 and getattr(second, "code", None) == -32700
    assert third == {"x": 1.5}


@pytest.mark.parametrize(
    ("method", "result"),
    [
        ("hello", {"session_id": 5, "env": {"name": "e", "version": "1"}, "protocol": "1"}),
        ("hello", {"session_id": "s", "env": "not an object", "protocol": "1"}),
        ("list_tasks", {}),
        ("list_tasks", {"tasks": 3}),
    ],
)
async def test_a_malformed_result_from_the_server_is_a_protocol_error_in_the_client(
    method: str, result: dict[str, Any]
) -> None:
    """6. The client raised KeyError / TypeError / ValidationError for malformed hello and
    tasks.list results instead of a ProtocolError."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = json.loads(await reader.readline())
        writer.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EnvClient(f"tcp://127.0.0.1:{port}", await FramedStream.open("127.0.0.1", port))
    try:
        with pytest.raises(ProtocolError, match="malformed"):
            await getattr(client, method)()
    finally:
        await client.close()
        server.close()
