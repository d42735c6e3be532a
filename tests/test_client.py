"""The control-channel client against real loopback servers (and a few deliberately bad ones)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import (
    ConfigError,
    ConnectionLostError,
    ProtocolError,
    ReadyTimeoutError,
    RemoteTaskError,
    UnauthorizedError,
)


def _env() -> Environment:
    env = Environment(name="c", version="9")

    @env.template()
    async def echo(text: str = "hi"):
        answer = yield text
        yield 1.0 if answer == text else 0.0

    @env.template()
    async def broken():
        yield "p"
        raise ValueError("no grade for you")

    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connect_retries_until_a_server_appears() -> None:
    port = _free_port()
    env = _env()

    async def late_server() -> None:
        await asyncio.sleep(0.4)
        async with serving(env, port=port):
            await asyncio.sleep(2)

    background = asyncio.create_task(late_server())
    try:
        client = await connect(f"tcp://127.0.0.1:{port}", ready_timeout=5)
        assert client.env is not None and client.env.name == "c"
        await client.close()
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)


async def test_connect_gives_up_after_the_ready_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(ReadyTimeoutError):
        await connect(f"tcp://127.0.0.1:{_free_port()}", ready_timeout=0.5)
    assert time.monotonic() - started < 2


async def test_a_server_that_accepts_then_closes_counts_as_not_ready() -> None:
    accepted = 0

    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(slam, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ReadyTimeoutError):
            await connect(f"tcp://127.0.0.1:{port}", ready_timeout=0.8)
        assert accepted >= 2
    finally:
        server.close()


async def test_only_tcp_urls_are_accepted() -> None:
    with pytest.raises(ConfigError):
        await connect("http://127.0.0.1:1", ready_timeout=0.1)


async def test_full_task_round_trip_and_remote_errors_raise_typed_exceptions() -> None:
    async with serving(_env()) as server:
        async with await connect(server.url) as client:
            assert [t["id"] for t in await client.list_tasks()] == ["echo", "broken"]
            assert await client.start_task("echo", {"text": "yo"}) == {"prompt": "yo"}
            assert await client.grade("yo") == {"score": 1.0}
            with pytest.raises(ProtocolError) as info:
                await client.start_task("nope", {})
            assert info.value.code == -32602
            await client.start_task("broken")
            with pytest.raises(RemoteTaskError, match="no grade for you"):
                await client.grade("x")
            assert await client.cancel() == {"cancelled": True}


async def test_close_parks_the_session_and_connect_can_resume_it() -> None:
    async with serving(_env()) as server:
        first = await connect(server.url)
        await first.start_task("echo", {"text": "again"})
        sid = first.session_id
        await first.close()
        await asyncio.sleep(0.05)
        second = await connect(server.url, session_id=sid)
        assert second.session_id == sid
        assert await second.grade("again") == {"score": 1.0}
        await second.bye()
        await asyncio.sleep(0.05)
        with pytest.raises(ProtocolError) as info:  # bye ended the session for good
            await connect(server.url, session_id=sid, ready_timeout=1)
        assert info.value.code == -32600


async def test_an_unknown_session_is_raised_at_once_not_retried() -> None:
    async with serving(_env()) as server:
        started = time.monotonic()
        with pytest.raises(ProtocolError) as info:
            await connect(server.url, session_id="sess-nope", ready_timeout=10)
        assert info.value.code == -32600
        assert time.monotonic() - started < 1


async def test_a_wrong_token_raises_unauthorized() -> None:
    async with serving(_env(), token="t0k") as server:
        with pytest.raises(UnauthorizedError):
            await connect(server.url, ready_timeout=2)
        async with await connect(server.url, token="t0k") as client:
            assert client.session_id


async def test_a_reply_with_a_mismatched_id_raises_32603_and_closes() -> None:
    async def liar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                frame = json.loads(line)
                reply_id = frame["id"] if frame["method"] == "hello" else 12345
                result = {"session_id": "sess-x", "env": {"name": "n", "version": "v"}, "bindings": [], "protocol": "1"}
                writer.write(json.dumps({"jsonrpc": "2.0", "id": reply_id, "result": result}).encode() + b"\n")
        finally:
            writer.close()

    server = await asyncio.start_server(liar, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = await connect(f"tcp://127.0.0.1:{port}", ready_timeout=2)
        with pytest.raises(ProtocolError) as info:
            await client.list_tasks()
        assert info.value.code == -32603
        with pytest.raises(ConnectionLostError):
            await client.list_tasks()
        await client.close()
    finally:
        server.close()


async def test_losing_the_server_mid_call_raises_connection_lost() -> None:
    env = Environment()
    gate = asyncio.Event()

    @env.template()
    async def slow():
        await gate.wait()
        yield "p"

    server_cm = serving(env)
    server = await server_cm.__aenter__()
    client = await connect(server.url)
    call = asyncio.create_task(client.start_task("slow"))
    await asyncio.sleep(0.1)
    await server_cm.__aexit__(None, None, None)
    with pytest.raises(ConnectionLostError):
        await asyncio.wait_for(call, 5)
    await client.close()


async def test_keepalive_resends_hello_for_its_own_session() -> None:
    async with serving(_env()) as server:
        client = await connect(server.url, keepalive_s=0.05)
        try:
            sid = client.session_id
            await asyncio.sleep(0.3)
            assert client._keepalive is not None and not client._keepalive.done()
            assert await client.start_task("echo") == {"prompt": "hi"}
            assert client.session_id == sid
        finally:
            await client.close()
