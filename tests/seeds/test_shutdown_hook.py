"""Seed 004's MCP example: its shutdown hook awaits the task it just cancelled.

``contextlib.suppress(Exception)`` does not catch the CancelledError that ``await _task`` raises,
so the hook itself ends in CancelledError. That is the hook's own failure: the environment logs it
and stops, and the batch that served it goes on.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from durable_rollouts import Environment, LocalRuntime, Taskset
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct

MCP_ENV = Path(__file__).parent / "envs" / "mcp_tools.py"


async def test_seed_mcp_example_shutdown_hook_does_not_abort_a_direct_batch() -> None:
    taskset = Taskset.from_file(MCP_ENV)
    job = await run_direct(taskset, FixedAgent(answer="result: 1"), LocalRuntime(MCP_ENV), group=2)
    assert [r.status for r in job.runs] == ["succeeded", "succeeded"]
    assert job.reward == 1.0
    assert not any("teardown_error" in r.trace.extra for r in job.runs)


async def test_a_hook_ending_in_cancelled_error_is_logged_and_later_hooks_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    env = Environment(name="hooks")
    ran: list[str] = []

    @env.shutdown
    async def first() -> None:  # registered first, runs last
        ran.append("first")

    @env.shutdown
    async def cancels_itself() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        await inner  # CancelledError: the hook's own, not its caller's

    await env.start()
    with caplog.at_level(logging.WARNING):
        await env.stop()
    assert ran == ["first"] and not env.started
    assert "cancels_itself" in caplog.text


async def test_stop_still_yields_to_a_real_cancellation_of_its_caller() -> None:
    env = Environment(name="slow-stop")
    ran: list[str] = []

    @env.shutdown
    async def after() -> None:
        ran.append("after")

    @env.shutdown
    async def slow() -> None:
        await asyncio.sleep(10)

    stopping = asyncio.ensure_future(env.stop())
    await asyncio.sleep(0.05)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert ran == []  # the caller was cancelled: stop gave up, as a cancelled task must
