"""Fixtures for the capability tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from scripted_llm import Reply, ScriptedLLM


@pytest.fixture
async def scripted_llm() -> AsyncIterator[Callable[[list[Reply]], Any]]:
    """``llm = await scripted_llm([...replies])`` starts a server; all are stopped afterwards."""
    servers: list[ScriptedLLM] = []

    async def make(script: list[Reply]) -> ScriptedLLM:
        server = ScriptedLLM(script)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()
