"""The env-server token: compared in constant time, enforced on hello, tunnel.open and every
method, and mandatory whenever the server listens beyond loopback."""

from __future__ import annotations

import asyncio
import hmac
import os
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from security_helpers import Raw, make_env

import durable_rollouts.envserver.server as server_module
from durable_rollouts.envserver import EnvServer, serve, serving
from durable_rollouts.errors import ConfigError

TOKEN = "s3cret-token"


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_hello_and_tunnel_open_compare_the_token_with_hmac_compare_digest(
    echo_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real_compare = hmac.compare_digest

    def recording_compare(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real_compare(a, b)

    # Only the server module's view of hmac is replaced: a plain == would record nothing.
    fake_hmac = types.SimpleNamespace(compare_digest=recording_compare)
    monkeypatch.setattr(server_module, "hmac", fake_hmac)
    async with serving(make_env(echo_port), token=TOKEN) as server:
        conn = await Raw.open(server.port)
        assert await conn.code("hello", {"token": TOKEN}) is None
        await conn.close()
        assert calls == [(TOKEN.encode(), TOKEN.encode())]

        tunnel = await Raw.open(server.port)
        assert (await tunnel.call("tunnel.open", {"capability": "echo", "token": TOKEN}))["result"]
        await tunnel.close()
        assert len(calls) == 2 and calls[1] == (TOKEN.encode(), TOKEN.encode())

        wrong = await Raw.open(server.port)
        assert await wrong.code("hello", {"token": "guess"}) == -32001
        await wrong.close()
        assert calls[2] == (b"guess", TOKEN.encode())


async def test_a_wrong_or_missing_token_is_32001_on_hello_and_on_tunnel_open(echo_port: int) -> None:
    async with serving(make_env(echo_port), token=TOKEN) as server:
        for params in ({}, {"token": "wrong"}, {"token": TOKEN[:-1]}, {"token": TOKEN + "x"}):
            conn = await Raw.open(server.port)
            assert await conn.code("hello", params) == -32001
            await conn.close()
            tunnel = await Raw.open(server.port)
            assert await tunnel.code("tunnel.open", {"capability": "echo", **params}) == -32001
            assert await asyncio.wait_for(tunnel.reader.read(), 5) == b""  # refused tunnels close
            await tunnel.close()


async def test_every_method_before_an_authenticated_hello_is_32001() -> None:
    async with serving(make_env(), token=TOKEN) as server:
        conn = await Raw.open(server.port)
        for method, params in [
            ("tasks.list", {}),
            ("tasks.start", {"id": "secret"}),
            ("tasks.grade", {"answer": "x"}),
            ("tasks.cancel", {}),
            ("bye", {}),
        ]:
            assert await conn.code(method, params) == -32001
        assert await conn.code("hello", {"token": "nope"}) == -32001
        assert await conn.code("hello", {"token": TOKEN}) is None
        assert await conn.code("tasks.list") is None
        await conn.close()
        assert server.grade_count == 0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
async def test_serving_beyond_loopback_without_a_token_raises_config_error(host: str) -> None:
    with pytest.raises(ConfigError, match="token"):
        async with serving(make_env(), host=host):
            pass
    with pytest.raises(ConfigError, match="token"):
        await asyncio.wait_for(serve(make_env(), host=host), 5)


def test_empty_tokens_are_refused() -> None:
    for token in ("", [], ["ok", ""]):
        with pytest.raises(ConfigError):
            EnvServer(make_env(), token=token)


def test_the_serve_entry_point_beyond_loopback_without_the_token_env_var_exits_2(tmp_path: Path) -> None:
    env_file = tmp_path / "env.py"
    env_file.write_text(
        "from durable_rollouts.envserver import Environment\nenv = Environment(name='e')\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "ROLLOUTS_ENV_TOKEN"}
    for host in ("0.0.0.0", "10.1.2.3"):
        proc = subprocess.run(
            [sys.executable, "-m", "durable_rollouts.envserver", str(env_file), "--host", host],
            env=environ,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2, proc.stderr
        assert "ROLLOUTS_ENV_TOKEN" in proc.stderr and "Traceback" not in proc.stderr
        assert "ROLLOUTS_SERVE_PORT" not in proc.stdout
