"""Fuzzing the client against a misbehaving server: whatever line comes back (garbage, wrong id,
odd result or error members, oversized, nothing at all), a call returns its documented type or
raises ``ProtocolError`` / ``ConnectionLostError``; never another exception, never a hang."""

from __future__ import annotations

import asyncio
import json

from fuzz_strategies import any_line, ids, json_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_rollouts.client.envclient import EnvClient
from durable_rollouts.client.framed import FramedStream
from durable_rollouts.errors import ConnectionLostError, ProtocolError

replies = st.one_of(
    any_line,
    st.builds(lambda r: json.dumps({"jsonrpc": "2.0", "id": 1, "result": r}).encode(), json_values),
    st.builds(lambda e: json.dumps({"jsonrpc": "2.0", "id": 1, "error": e}).encode(), json_values),
    st.builds(
        lambda i, sid, env: json.dumps(
            {"jsonrpc": "2.0", "id": i, "result": {"session_id": sid, "env": env, "protocol": "1"}}
        ).encode(),
        ids,
        json_values,
        json_values,
    ),
)


async def _exchange(reply: bytes | None, method: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        if reply is not None:
            writer.write(reply + b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EnvClient(f"tcp://127.0.0.1:{port}", await FramedStream.open("127.0.0.1", port))
    try:
        result = await asyncio.wait_for(getattr(client, method)(), 5)
        assert isinstance(result, list if method == "list_tasks" else dict)
    except (ProtocolError, ConnectionLostError):
        pass
    finally:
        await client.close()
        server.close()


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(reply=st.none() | replies, method=st.sampled_from(["hello", "list_tasks", "cancel"]))
def test_any_server_reply_yields_a_result_or_a_protocol_error(reply: bytes | None, method: str) -> None:
    asyncio.run(_exchange(reply, method))
