"""A client on the env server's own event loop reaches it over a socket pair, everyone else over TCP.

Real servers, real sockets: the in-process shortcut must serve the same frames as TCP, obey the
connection limit, park a dropped session, and disappear when the server stops.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from envserver_helpers import make_env

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import serving
from durable_rollouts.envserver.sessions import SessionState
from durable_rollouts.errors import ProtocolError
from durable_rollouts.streams import open_stream


def _family(client: object) -> socket.AddressFamily:
    sock = client._stream.writer.get_extra_info("socket")  # type: ignore[attr-defined]
    return socket.AddressFamily(sock.family)


async def test_a_client_on_the_servers_loop_uses_a_socket_pair_and_runs_a_whole_task() -> None:
    log: list[str] = []
    async with serving(make_env(log)) as server:
        client = await connect(server.url, keepalive_s=None)
        try:
            assert _family(client) == socket.AF_UNIX
            started = await client.start_task("count", {"word": "banana", "letter": "a"})
            assert "banana" in str(started)
            graded = await client.grade("3")
            assert graded["score"] == 1.0
        finally:
            await client.close()
        assert log[:3] == ["start:banana", "grade:3", "teardown:banana"]
        # TCP still serves: a raw connection from this loop bypasses the shortcut.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b'{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {}}\n')
        await writer.drain()
        assert b'"session_id"' in await asyncio.wait_for(reader.readline(), 10)
        writer.close()


async def test_a_client_on_another_loop_goes_over_tcp() -> None:
    async with serving(make_env()) as server:
        families: list[socket.AddressFamily] = []

        async def other() -> None:
            client = await connect(server.url, keepalive_s=None)
            families.append(_family(client))
            assert (await client.start_task("count", {"word": "kiwi", "letter": "i"}))
            assert (await client.grade("2"))["score"] == 1.0
            await client.close()

        thread = threading.Thread(target=lambda: asyncio.run(other()))
        thread.start()
        await asyncio.to_thread(thread.join, 30)
        assert families == [socket.AF_INET]


async def test_socket_pair_connections_count_against_the_connection_limit() -> None:
    async with serving(make_env(), max_connections=1) as server:
        held = await connect(server.url, keepalive_s=None)
        with pytest.raises(ProtocolError, match="busy"):
            await connect(server.url, keepalive_s=None, ready_timeout=2)
        await held.close()


async def test_a_dropped_socket_pair_parks_the_session_and_a_new_one_resumes_it() -> None:
    async with serving(make_env()) as server:
        client = await connect(server.url, keepalive_s=None)
        await client.start_task("count", {"word": "banana", "letter": "a"})
        session_id = client.session_id
        client._stream.writer.transport.abort()  # type: ignore[union-attr]  # a cut, not a bye
        for _ in range(100):
            found = server.sessions.get(session_id or "")
            if found is not None and found.state is SessionState.PARKED:
                break
            await asyncio.sleep(0.02)
        again = await connect(server.url, keepalive_s=None, session_id=session_id)
        assert (await again.grade("3"))["score"] == 1.0
        await again.close()


async def test_after_stop_the_shortcut_is_gone_and_the_address_refuses() -> None:
    async with serving(make_env()) as server:
        host, port = server.host, server.port
        reader, writer = await open_stream(host, port)
        assert writer.get_extra_info("socket").family == socket.AF_UNIX
        writer.close()
    assert await reader.read() == b""  # the server's side was closed at stop
    with pytest.raises(ConnectionRefusedError):
        await open_stream(host, port)
