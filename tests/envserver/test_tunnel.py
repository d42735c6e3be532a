"""tunnel.open: one control port carries raw byte streams to capabilities, server and client side."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Capability, Environment, EnvServer, serving
from durable_rollouts.errors import ConfigError


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def tunnel_server(echo_port: int) -> AsyncIterator[EnvServer]:
    env = Environment(name="tun")
    env.add_capability(Capability(name="echo", protocol="tcp/1", url=f"tcp://127.0.0.1:{echo_port}"))
    env.add_capability(Capability(name="shell", protocol="ssh/2", url=f"ssh://agent@127.0.0.1:{echo_port}/work?x=1"))
    async with serving(env) as server:
        yield server


async def _open_tunnel(port: int, capability: str, token: str | None = None):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    params = {"capability": capability} | ({"token": token} if token else {})
    writer.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tunnel.open", "params": params}).encode() + b"\n")
    reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
    return reader, writer, reply


async def test_bytes_round_trip_through_tunnel_open(tunnel_server: EnvServer) -> None:
    reader, writer, reply = await _open_tunnel(tunnel_server.port, "echo")
    try:
        assert reply == {"jsonrpc": "2.0", "id": 1, "result": {"capability": "echo"}}
        payload = b"raw\nbytes\x00 not json\n" * 100
        writer.write(payload)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == payload
    finally:
        writer.close()


async def test_concurrent_tunnels_do_not_interleave(tunnel_server: EnvServer) -> None:
    async def stream(i: int) -> bytes:
        reader, writer, _ = await _open_tunnel(tunnel_server.port, "echo")
        try:
            for _ in range(20):
                writer.write(f"<{i}>".encode() * 50)
                await writer.drain()
                await asyncio.sleep(0)
            writer.write_eof()
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()

    results = await asyncio.gather(*(stream(i) for i in range(8)))
    for i, data in enumerate(results):
        assert data == f"<{i}>".encode() * 1000


async def test_unknown_capability_gets_an_error_frame_and_the_connection_closes(tunnel_server: EnvServer) -> None:
    reader, writer, reply = await _open_tunnel(tunnel_server.port, "nope")
    try:
        assert reply["error"]["code"] == -32602 and "nope" in reply["error"]["message"]
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()


async def test_tunnel_open_inside_a_session_is_method_not_found(tunnel_server: EnvServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tunnel_server.port)
    try:
        for i, method in enumerate(("hello", "tunnel.open"), start=1):
            frame = {"jsonrpc": "2.0", "id": i, "method": method, "params": {"capability": "echo"} if i == 2 else {}}
            writer.write(json.dumps(frame).encode() + b"\n")
            reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
        assert reply["error"]["code"] == -32601
    finally:
        writer.close()


async def test_tunnels_need_the_token_when_the_server_has_one(echo_port: int) -> None:
    env = Environment()
    env.add_capability(Capability(name="echo", protocol="tcp/1", url=f"tcp://127.0.0.1:{echo_port}"))
    async with serving(env, token="tok") as server:
        _, writer, reply = await _open_tunnel(server.port, "echo")
        writer.close()
        assert reply["error"]["code"] == -32001
        reader, writer, reply = await _open_tunnel(server.port, "echo", token="tok")
        try:
            assert reply["result"] == {"capability": "echo"}
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        finally:
            writer.close()


async def test_client_forwarders_reach_each_binding_through_the_control_port(tunnel_server: EnvServer) -> None:
    async with await connect(tunnel_server.url) as client:
        echo = client.binding("echo")
        parts = urlsplit(echo["url"])
        assert parts.hostname == "127.0.0.1" and parts.port != tunnel_server.port
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(b"hello through the tunnel")
            assert await asyncio.wait_for(reader.readexactly(24), 5) == b"hello through the tunnel"
        finally:
            writer.close()


async def test_binding_lookup_keeps_user_path_and_query_and_rejects_unknown_or_ambiguous(
    tunnel_server: EnvServer,
) -> None:
    async with await connect(tunnel_server.url) as client:
        shell = client.binding("ssh")  # by protocol family
        parts = urlsplit(shell["url"])
        assert (parts.scheme, parts.username, parts.path, parts.query) == ("ssh", "agent", "/work", "x=1")
        assert client.binding("ssh/2") == shell == client.binding("shell")
        with pytest.raises(KeyError):
            client.binding("rfb")
        client.bindings.append({"name": "shell2", "protocol": "ssh/2", "url": "ssh://h:1"})
        with pytest.raises(ConfigError):
            client.binding("ssh")


async def test_closing_the_client_removes_its_forwarders(tunnel_server: EnvServer) -> None:
    client = await connect(tunnel_server.url)
    port = urlsplit(client.binding("echo")["url"]).port
    await client.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


@pytest.fixture
async def banner_port() -> AsyncIterator[int]:
    """A server that speaks first (like ssh): a banner line, then it echoes."""

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"SSH-2.0-Test_1.0\r\nsecond line\n")
            await writer.drain()
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_bytes_a_capability_sends_first_reach_the_client_through_a_forwarder(banner_port: int) -> None:
    env = Environment()
    env.add_capability(Capability(name="shell", protocol="ssh/2", url=f"ssh://127.0.0.1:{banner_port}"))
    async with serving(env) as server, await connect(server.url) as client:
        parts = urlsplit(client.binding("shell")["url"])
        for _ in range(3):  # the banner races the tunnel reply; it must never be eaten as a frame
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            try:
                assert await asyncio.wait_for(reader.readline(), 5) == b"SSH-2.0-Test_1.0\r\n"
                assert await asyncio.wait_for(reader.readline(), 5) == b"second line\n"
                writer.write(b"echo me\n")
                assert await asyncio.wait_for(reader.readline(), 5) == b"echo me\n"
            finally:
                writer.close()


async def test_lines_sent_in_the_same_write_as_tunnel_open_are_piped_not_parsed(tunnel_server: EnvServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tunnel_server.port)
    try:
        frame = {"jsonrpc": "2.0", "id": 1, "method": "tunnel.open", "params": {"capability": "echo"}}
        writer.write(json.dumps(frame).encode() + b'\n{"jsonrpc":"2.0","id":2,"method":"hello"}\nraw\n')
        assert json.loads(await asyncio.wait_for(reader.readline(), 5))["result"] == {"capability": "echo"}
        assert await asyncio.wait_for(reader.readline(), 5) == b'{"jsonrpc":"2.0","id":2,"method":"hello"}\n'
        assert await asyncio.wait_for(reader.readline(), 5) == b"raw\n"
    finally:
        writer.close()


async def test_control_frames_pipelined_in_one_write_are_all_answered(tunnel_server: EnvServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tunnel_server.port)
    try:
        frames = [{"jsonrpc": "2.0", "id": i, "method": m} for i, m in enumerate(("hello", "tasks.list", "bye"), 1)]
        writer.write(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
        replies = [json.loads(await asyncio.wait_for(reader.readline(), 5)) for _ in frames]
        assert [r["id"] for r in replies] == [1, 2, 3] and all("result" in r for r in replies)
    finally:
        writer.close()
