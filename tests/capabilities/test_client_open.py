"""``client.open(name)``: live capability clients from the env client, cached and closed with it.

Real parts: a served env with a workspace (asyncssh) and a fastmcp server, reached through the
control channel's ``tunnel.open``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mcp_tools import calculator

from durable_rollouts import Capability, Environment
from durable_rollouts.client.capabilities import CapabilityNotFoundError
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import serving
from durable_rollouts.errors import ConfigError, InvalidStateError
from durable_rollouts.sdk.run import Run


def _env(tmp_path: Path) -> Environment:
    env = Environment(name="open")
    env.workspace(tmp_path / "ws", isolation="none")
    env.mcp(calculator(), name="tools")
    return env


async def test_client_open_returns_live_clients_cached_per_binding(tmp_path: Path) -> None:
    async with serving(_env(tmp_path)) as server, await connect(server.url, keepalive_s=None) as client:
        shell = await client.open("shell")
        assert await client.open("shell") is shell
        assert await client.open("ssh") is shell  # a protocol family names the same binding
        done = await shell.run("echo hi > made.txt && cat made.txt", check=True)
        assert done.stdout == "hi\n"
        tools = await client.open("tools")
        assert (await tools.call_tool("add", {"a": 2, "b": 3})).data == 5
        both = await asyncio.gather(*(client.open("tools") for _ in range(5)))
        assert all(t is tools for t in both)
    assert (tmp_path / "ws" / "made.txt").read_text() == "hi\n"


async def test_closing_the_client_closes_what_it_opened(tmp_path: Path) -> None:
    async with serving(_env(tmp_path)) as server:
        client = await connect(server.url, keepalive_s=None)
        shell = await client.open("shell")
        tools = await client.open("tools")
        assert not shell.is_closed() and tools.is_connected()
        await client.close()
        await asyncio.wait_for(shell.wait_closed(), 5)
        assert shell.is_closed() and not tools.is_connected()


async def test_close_capabilities_closes_handles_but_keeps_the_session(tmp_path: Path) -> None:
    async with serving(_env(tmp_path)) as server, await connect(server.url, keepalive_s=None) as client:
        first = await client.open("shell")
        await client.close_capabilities()
        assert first.is_closed()
        again = await client.open("shell")  # a fresh connection, the session is still there
        assert again is not first and (await again.run("true")).exit_status == 0
        assert await client.list_tasks() == []


async def test_opening_an_unknown_capability_names_the_bindings_the_env_has(tmp_path: Path) -> None:
    async with serving(_env(tmp_path)) as server, await connect(server.url, keepalive_s=None) as client:
        with pytest.raises(CapabilityNotFoundError) as info:
            await client.open("browser")
    message = str(info.value)
    assert "no capability 'browser'" in message
    assert "shell (ssh/2)" in message and "tools (mcp/2025-11-25)" in message


async def test_run_open_is_the_clients_open(tmp_path: Path) -> None:
    async with serving(_env(tmp_path)) as server, await connect(server.url, keepalive_s=None) as client:
        run = Run(client=client)
        assert await run.open("shell") is await client.open("shell")
        await run.close_capabilities()
        assert (await client.open("shell")).is_closed() is False
    with pytest.raises(InvalidStateError, match="needs a connected run"):
        await Run().open("shell")


async def test_an_mcp_binding_without_a_transport_opens_by_its_url_scheme(tmp_path: Path) -> None:
    """HUD's ``Capability(...)`` may publish an mcp binding with no ``transport`` param."""
    served = Environment(name="bare")
    service = served.mcp(calculator(), name="typed")
    async with serving(served):
        url = service.capability.url if service.capability else ""
        env = Environment(name="bare-mcp")
        env.add_capability(Capability(name="tools", protocol="mcp/2025-11-25", url=url))
        env.add_capability(Capability(name="ws", protocol="mcp/2025-11-25",
                                      url=url.replace("http://", "ws://")))
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            tools = await client.open("tools")
            assert (await tools.call_tool("add", {"a": 1, "b": 1})).data == 2
            with pytest.raises(ConfigError, match="transport 'websocket' .* is not supported"):
                await client.open("ws")
