"""Fixtures for envserver tests: a served test environment and raw socket connections."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from envserver_helpers import RawConn, make_env

from durable_rollouts.envserver import EnvServer, serving


@pytest.fixture
def env_log() -> list[str]:
    return []


@pytest.fixture
async def server(env_log: list[str]) -> AsyncIterator[EnvServer]:
    async with serving(make_env(env_log), park_ttl_s=30) as srv:
        yield srv


@pytest.fixture
async def raw(server: EnvServer) -> AsyncIterator[Callable[[], Any]]:
    """Factory for raw connections to ``server``; all are closed afterwards."""
    conns: list[RawConn] = []

    async def open_conn() -> RawConn:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        conn = RawConn(reader, writer)
        conns.append(conn)
        return conn

    yield open_conn
    for conn in conns:
        await conn.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Env server processes a test starts; killed and reaped afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
