"""The mcp capability: a real fastmcp server on loopback, called through ``tunnel.open``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest
from fastmcp import FastMCP
from mcp_tools import calculator

from durable_rollouts.client.capabilities import close_capability, open_capability
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.envserver.mcp import McpService, add_mcp
from durable_rollouts.errors import EnvError


async def test_an_mcp_tool_is_called_through_the_tunnel() -> None:
    env = Environment(name="calc")
    env.mcp(calculator(), name="tools")
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        published = env.capability("tools")
        binding = client.binding("tools")
        assert binding["protocol"].startswith("mcp/")
        assert binding["url"] != published.url  # the client reaches it through its forwarder
        mcp = await open_capability(client, "tools")
        try:
            tools = {t.name: t for t in await mcp.list_tools()}
            result = await mcp.call_tool("add", {"a": 2, "b": 40})
        finally:
            await close_capability(mcp)
    assert set(tools) == {"add"}
    schema = getattr(tools["add"], "input_schema", None) or tools["add"].inputSchema  # mcp 2 / mcp 1
    assert schema["required"] == ["a", "b"]
    assert result.data == 42


def _hanging() -> FastMCP:
    @contextlib.asynccontextmanager
    async def never_ready(_: FastMCP) -> AsyncIterator[None]:
        await asyncio.Event().wait()
        yield

    return FastMCP("hangs", lifespan=never_ready)


def _crashing() -> FastMCP:
    @contextlib.asynccontextmanager
    async def crash(_: FastMCP) -> AsyncIterator[None]:
        raise RuntimeError("the daemon fell over")
        yield

    return FastMCP("crashes", lifespan=crash)


async def test_an_mcp_server_that_never_comes_up_fails_the_serve_naming_it() -> None:
    env = Environment(name="slow")
    add_mcp(env, _hanging(), name="slowtools", ready_timeout_s=0.5)
    began = time.monotonic()
    with pytest.raises(EnvError, match="slowtools"):
        async with serving(env):
            pass
    assert time.monotonic() - began < 8


async def test_an_mcp_server_that_crashes_on_start_fails_fast_naming_it() -> None:
    env = Environment(name="crashy")
    add_mcp(env, _crashing(), name="crashtools", ready_timeout_s=30)
    began = time.monotonic()
    with pytest.raises(EnvError, match="crashtools"):
        async with serving(env):
            pass
    assert time.monotonic() - began < 5  # noticed the crash, did not wait for the timeout


async def test_an_external_mcp_url_that_never_listens_fails_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = McpService(f"http://127.0.0.1:{port}/mcp", name="external", ready_timeout_s=0.3)
    with pytest.raises(EnvError, match="external"):
        await service.start()


async def test_the_readiness_wait_polls_instead_of_sleeping() -> None:
    service = McpService(calculator(), name="quick")
    began = time.monotonic()
    cap = await service.start()
    try:
        assert time.monotonic() - began < 2
        host_port = cap.url.split("//")[1].split("/")[0]
        _, writer = await asyncio.open_connection(*host_port.split(":"))
        writer.close()
    finally:
        await service.stop()
    assert service.capability is None
