"""Workflow activations run inline on the worker's loop (``temporal.activations``)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from durable_rollouts.temporal import activations
from durable_rollouts.temporal.activations import InlineActivations, activation_executor


async def test_calls_run_on_the_loop_thread_and_keep_the_running_loop() -> None:
    loop = asyncio.get_running_loop()
    executor = InlineActivations()

    def activation(x: int) -> tuple[int, str]:
        asyncio.events._set_running_loop(None)  # what a workflow activation's own loop leaves behind
        return x * 2, threading.current_thread().name

    assert await loop.run_in_executor(executor, activation, 21) == (42, threading.current_thread().name)
    assert asyncio.get_running_loop() is loop  # restored after the call
    assert not executor._threads


async def test_an_exception_reaches_the_awaiting_task() -> None:
    def boom() -> None:
        raise ValueError("bad activation")

    with pytest.raises(ValueError, match="bad activation"):
        await asyncio.get_running_loop().run_in_executor(InlineActivations(), boom)


async def test_a_slow_activation_is_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(activations, "SLOW_ACTIVATION_S", 0.01)
    with caplog.at_level(logging.WARNING, logger=activations.__name__):
        await asyncio.get_running_loop().run_in_executor(InlineActivations(), __import__("time").sleep, 0.05)
    assert "held the worker's event loop" in caplog.text


def test_inline_is_opt_in_and_never_for_sandboxed_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(activations.ENV, raising=False)
    assert activation_executor(sandboxed=False) is None  # temporalio's pool by default
    monkeypatch.setenv(activations.ENV, "1")
    assert isinstance(activation_executor(sandboxed=False), InlineActivations)
    assert activation_executor(sandboxed=True) is None  # the sandbox keeps the pool
    monkeypatch.setenv(activations.ENV, "0")
    assert activation_executor(sandboxed=False) is None
