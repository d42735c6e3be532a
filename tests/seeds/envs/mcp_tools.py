# Seed 004, "MCP capability - in-process tool server", with `hud` renamed to `durable_rollouts`.
# The template body is cut off in the seed; `use_tool` below is ours (it only asks for an answer).
import asyncio
import contextlib
import socket

from fastmcp import FastMCP

from durable_rollouts.capabilities import Capability
from durable_rollouts.environment import Environment

server = FastMCP(name="my-env")
env = Environment(name="my-env")
_task: asyncio.Task | None = None


@server.tool
async def do_thing(x: int) -> str:
    return f"result: {x}"


@env.initialize
async def _start() -> None:
    global _task
    if _task is None:
        s = socket.socket()
        s.bind(("", 0))
        port = s.getsockname()[1]
        s.close()
        _task = asyncio.create_task(
            server.run_async(transport="http", host="127.0.0.1", port=port, show_banner=False)
        )
        await asyncio.sleep(0.3)
        env.add_capability(Capability.mcp(name="tools", url=f"http://127.0.0.1:{port}/mcp"))


@env.shutdown
async def _stop() -> None:
    global _task
    if _task is not None:
        _task.cancel()
        with contextlib.suppress(Exception):
            await _task
        _task = None


@env.template()
async def use_tool(x: int = 1):
    answer = yield f"Call do_thing with x={x} and answer with its result."
    yield 1.0 if answer and f"result: {x}" in answer else 0.0


tasks = [use_tool(x=1)]
