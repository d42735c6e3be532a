"""Client-side openers: raw tcp through the tunnel, unknown names, retries with backoff."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from fastmcp import FastMCP

from durable_rollouts.client.capabilities import (
    CapabilityNotFoundError,
    _is_transient,
    close_capability,
    open_capability,
)
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Capability, Environment, serving
from durable_rollouts.errors import ConfigError
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.taskset import Taskset


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def test_a_raw_tcp_capability_works_through_the_tunnel() -> None:
    echo = await _echo_server()
    port = echo.sockets[0].getsockname()[1]
    env = Environment(name="raw")
    env.add_capability(Capability(name="echo", protocol="tcp", url=f"tcp://127.0.0.1:{port}"))
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
    try:
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            reader, writer = await open_capability(client, "echo")
            try:
                writer.write(b"ping\n")
                assert await asyncio.wait_for(reader.readexactly(5), 5) == b"ping\n"
                writer.write(payload)
                writer.write_eof()
                assert await asyncio.wait_for(reader.read(), 5) == payload
            finally:
                await close_capability((reader, writer))
    finally:
        echo.close()


async def test_opening_a_capability_the_env_lacks_lists_what_exists() -> None:
    echo = await _echo_server()
    port = echo.sockets[0].getsockname()[1]
    env = Environment(name="few")
    env.add_capability(Capability(name="echo", protocol="tcp", url=f"tcp://127.0.0.1:{port}"))
    env.add_capability(Capability(name="screen", protocol="rfb/3.8", url=f"rfb://127.0.0.1:{port}"))
    try:
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            with pytest.raises(CapabilityNotFoundError) as info:
                await open_capability(client, "shell")
    finally:
        echo.close()
    message = str(info.value)
    assert "'shell'" in message and "echo (tcp)" in message and "screen (rfb/3.8)" in message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, KeyError)


async def test_a_capability_that_comes_up_late_is_reached_by_retrying() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = Environment(name="late")
    env.add_capability(Capability(name="tools", protocol="mcp/2025-11-25",
                                  url=f"http://127.0.0.1:{port}/mcp"))
    late = FastMCP("late")

    @late.tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    async def come_up_later() -> None:
        await asyncio.sleep(0.3)
        await late.run_http_async(host="127.0.0.1", port=port, show_banner=False, log_level="warning")

    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        with pytest.raises(RuntimeError) as refused:  # nothing listens yet: one attempt fails
            await open_capability(client, "tools", attempts=1)
        assert _is_transient(refused.value)  # ... and counts as "retry me"
        daemon = asyncio.create_task(come_up_later())
        try:
            mcp = await open_capability(client, "tools", attempts=5, backoff_s=0.2)
            try:
                assert (await mcp.call_tool("ping", {})).data == "pong"
            finally:
                await close_capability(mcp)
        finally:
            daemon.cancel()
            await asyncio.gather(daemon, return_exceptions=True)


class ShellProbeAgent(Agent):
    """Answers with the output of ``pwd`` run through ``await run.open("shell")``."""

    async def __call__(self, run: Run) -> None:
        conn = await run.open("shell")
        assert await run.open("shell") is conn  # cached for the run
        result = await conn.run("pwd", check=False)
        run.trace.content = result.stdout.strip()


async def test_an_agent_opens_a_capability_with_run_open(tmp_path: Path) -> None:
    env = Environment(name="probe")
    env.workspace(tmp_path / "ws", isolation="none")

    @env.template()
    async def where():
        answer = yield "Where does the shell start?"
        yield 1.0 if answer == str(tmp_path / "ws") else 0.0

    job = await run_direct(Taskset("probe", [where()]), ShellProbeAgent(), LocalRuntime(env))
    assert job.runs[0].reward == 1.0, job.runs[0].error
