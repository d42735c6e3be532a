"""Connection and task limits of the env server, over real loopback sockets and real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from envserver_helpers import RawConn, make_env, read_port

from durable_rollouts.activities.failures import map_errors
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import EnvServer, serving
from durable_rollouts.envserver.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TASKS
from durable_rollouts.errors import ConfigError, ProtocolError, ServerBusyError
from durable_rollouts.protocol import ErrorCode, error_from_frame
from durable_rollouts.settings import MAX_CHILDREN_PER_WORKFLOW as WIDTH

BUSY = -32002

LIMITS_ENV = """
from durable_rollouts.envserver import Environment

env = Environment(name="limits")

@env.template()
async def t():
    answer = yield "p"
    yield 1.0
"""


async def _open(port: int) -> RawConn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return RawConn(reader, writer)


async def _served(port: int) -> RawConn:
    """A connection the server has taken on (its hello was answered)."""
    conn = await _open(port)
    await conn.result("hello")
    return conn


async def _assert_refused(port: int, *, send_first: bool = False, limit: int | None = None) -> None:
    """The next connection gets one busy error frame (id null), then EOF."""
    conn = await _open(port)
    try:
        if send_first:  # a request already sent must not turn the close into a reset
            await conn.send({"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {}})
        frame = await conn.recv(timeout=5)
        assert frame["id"] is None and frame["error"]["code"] == BUSY, frame
        assert "busy" in frame["error"]["message"]
        if limit is not None:
            assert f"{limit} connections" in frame["error"]["message"]
        assert await conn.closed_by_server(timeout=5)
    finally:
        await conn.close()


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def _start(word: str) -> dict[str, object]:
    return {"id": "count", "args": {"word": word}}


# -- connection limit ------------------------------------------------------------------------------


async def test_a_connection_over_the_limit_gets_one_busy_error_frame_and_is_closed() -> None:
    async with serving(make_env(), max_connections=2) as server:
        first, second = await _served(server.port), await _served(server.port)
        await _assert_refused(server.port, limit=2)
        await _assert_refused(server.port, send_first=True, limit=2)
        assert (await first.result("hello"))["session_id"]  # the served ones are unaffected
        assert (await second.result("tasks.list"))["tasks"]
        await first.close()
        await second.close()


async def test_a_connection_slot_frees_when_a_connection_closes() -> None:
    async with serving(make_env(), max_connections=1) as server:
        held = await _served(server.port)
        await _assert_refused(server.port)
        await held.close()

        async def accepted() -> bool:
            conn = await _open(server.port)
            try:
                return "result" in await conn.call("hello")
            finally:
                await conn.close()

        await _eventually(accepted)


# -- task limit ------------------------------------------------------------------------------------


async def test_tasks_start_over_the_task_limit_is_busy_and_existing_sessions_are_unaffected() -> None:
    log: list[str] = []
    async with serving(make_env(log), max_tasks=2) as server:
        a, b, c = [await _served(server.port) for _ in range(3)]
        await a.result("tasks.start", _start("apple"))
        await b.result("tasks.start", _start("banana"))
        reply = await c.call("tasks.start", _start("cherry"))
        assert reply["error"]["code"] == BUSY, reply
        assert "busy" in reply["error"]["message"] and "limit 2" in reply["error"]["message"]
        assert "start:cherry" not in log  # the refused task never ran
        assert await b.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
        assert await c.result("tasks.start", _start("cherry")) == {"prompt": "count a in cherry"}
        assert await a.result("tasks.grade", {"answer": "1"}) == {"score": 1.0}
        for conn in (a, b, c):
            await conn.close()


async def test_parked_sessions_hold_their_task_slot_until_they_expire() -> None:
    log: list[str] = []
    async with serving(make_env(log), max_tasks=1, park_ttl_s=0.5) as server:
        a = await _served(server.port)
        await a.result("tasks.start", _start("apple"))
        await a.close()  # parked with its task
        b = await _served(server.port)
        assert await b.error_code("tasks.start", _start("banana")) == BUSY
        assert "teardown:apple" not in log

        async def started() -> bool:
            return "result" in await b.call("tasks.start", _start("banana"))

        await _eventually(started)
        assert "teardown:apple" in log
        await b.close()


async def test_restarting_cancelling_or_leaving_frees_the_slot_without_needing_another() -> None:
    async with serving(make_env(), max_tasks=1) as server:
        a, b = await _served(server.port), await _served(server.port)
        await a.result("tasks.start", _start("apple"))
        await a.result("tasks.start", _start("avocado"))  # replaces its own task: same slot
        assert await b.error_code("tasks.start", _start("banana")) == BUSY
        await a.result("tasks.cancel")
        await b.result("tasks.start", _start("banana"))
        assert await a.error_code("tasks.start", _start("apple")) == BUSY
        await b.result("bye")
        await a.result("tasks.start", _start("apple"))
        for conn in (a, b):
            await conn.close()


# -- defaults --------------------------------------------------------------------------------------


async def test_the_defaults_never_throttle_a_full_batch_on_a_shared_server() -> None:
    """The limits guard against runaway clients: one batch workflow (a wider batch runs as parts
    of at most ROLLOUTS_CHILDREN_PER_WORKFLOW <= WIDTH) keeps at most WIDTH rollouts in flight,
    each with up to two connections, so a shared server never refuses them."""
    assert DEFAULT_MAX_TASKS > WIDTH and DEFAULT_MAX_CONNECTIONS >= 2 * WIDTH
    async with serving(make_env()) as server:
        assert (server.max_connections, server.max_tasks) == (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TASKS)
        assert server.sessions.max_idle_parked > WIDTH
        conns = [await _served(server.port) for _ in range(300)]
        for conn in conns:
            await conn.result("tasks.start", _start("apple"))
        for conn in conns:
            await conn.close()


def test_limits_below_one_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        EnvServer(make_env(), max_connections=0)
    with pytest.raises(ConfigError, match="max_tasks"):
        EnvServer(make_env(), max_tasks=0)


# -- the client's view -----------------------------------------------------------------------------


async def test_the_client_raises_the_retryable_server_busy_error_for_both_limits() -> None:
    async with serving(make_env(), max_connections=2, max_tasks=1) as server:
        first = await connect(server.url, ready_timeout=5, keepalive_s=None)
        second = await connect(server.url, ready_timeout=5, keepalive_s=None)
        await first.start_task("count")
        with pytest.raises(ServerBusyError) as task_busy:
            await second.start_task("count")
        assert task_busy.value.code == ErrorCode.BUSY == BUSY
        began = time.monotonic()
        with pytest.raises(ServerBusyError, match="2 connections"):
            await connect(server.url, ready_timeout=30, keepalive_s=None)
        assert time.monotonic() - began < 5  # answered at once, not after the ready timeout
        await first.close()
        await second.close()
    assert type(error_from_frame({"code": BUSY, "message": "busy"})) is ServerBusyError
    assert issubclass(ServerBusyError, ProtocolError)
    with pytest.raises(ServerBusyError), map_errors():  # re-raised unchanged: Temporal retries it
        raise ServerBusyError(BUSY, "busy")


# -- flags reach the server ------------------------------------------------------------------------


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUTS_ENV_TOKEN"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


_MODULE = [sys.executable, "-m", "durable_rollouts.envserver"]
_CLI = [sys.executable, "-c", "from durable_rollouts.cli import main; main()", "serve"]


@pytest.mark.parametrize("command", [_MODULE, _CLI], ids=["python-m", "rollouts-serve"])
async def test_max_connections_and_max_tasks_flags_reach_the_server(
    command: list[str], tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    env_file = tmp_path / "limits_env.py"
    env_file.write_text(LIMITS_ENV)
    proc = _spawn([*command, str(env_file), "--max-connections", "2", "--max-tasks", "1"])
    procs.append(proc)
    port = read_port(proc)
    a, b = await _served(port), await _served(port)
    await a.result("tasks.start", {"id": "t"})
    reply = await b.call("tasks.start", {"id": "t"})
    assert reply["error"]["code"] == BUSY and "limit 1" in reply["error"]["message"]
    await _assert_refused(port, limit=2)
    await a.close()
    await b.close()


@pytest.mark.parametrize("command", [_MODULE, _CLI], ids=["python-m", "rollouts-serve"])
def test_a_limit_below_one_exits_2_with_one_line(command: list[str], procs: list[subprocess.Popen[str]]) -> None:
    proc = _spawn([*command, "/nonexistent/env.py", "--max-tasks", "0"])
    procs.append(proc)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == ["error: --max-tasks must be at least 1, got 0"]


# -- idle parked sessions --------------------------------------------------------------------------


async def test_idle_parked_sessions_beyond_the_cap_are_closed_oldest_first() -> None:
    """Sessions that said hello and left (no task) are capped; a parked task is never evicted."""
    log: list[str] = []
    async with serving(make_env(log)) as server:
        server.sessions.max_idle_parked = 2
        with_task = await _open(server.port)
        kept_sid = (await with_task.result("hello"))["session_id"]
        await with_task.result("tasks.start", _start("apple"))
        await with_task.close()
        idle: list[str] = []
        for _ in range(4):
            conn = await _open(server.port)
            idle.append((await conn.result("hello"))["session_id"])
            await conn.close()
            await _eventually(lambda sid=idle[-1]: _parked(server, sid))
        assert [sid in server.sessions for sid in idle] == [False, False, True, True]
        assert kept_sid in server.sessions  # a parked task outlives any number of idle sessions

        async def resumes(sid: str) -> bool:
            conn = await _open(server.port)
            try:
                return "result" in await conn.call("hello", {"session_id": sid})
            finally:
                await conn.close()

        assert not await resumes(idle[0])
        assert await resumes(idle[3])
        assert await resumes(kept_sid)
        assert "teardown:apple" not in log


async def _parked(server: EnvServer, sid: str) -> bool:
    session = server.sessions.get(sid)
    return session is None or session.state.value == "parked"


# -- a server at its limits says so once, naming the limit and the knob ------------------------------


async def test_a_server_at_its_task_limit_logs_one_warning_naming_max_tasks(caplog) -> None:
    """Every start over the limit is refused as busy, but the log gets one warning, not one per
    refusal: it names the env, the limit and the flag that raises it."""
    caplog.set_level("WARNING", logger="durable_rollouts.envserver")
    async with serving(make_env(), max_tasks=1) as server:
        conns = [await _served(server.port) for _ in range(4)]
        await conns[0].result("tasks.start", _start("apple"))
        for conn in conns[1:]:
            assert await conn.error_code("tasks.start", _start("pear")) == BUSY
        for conn in conns:
            await conn.close()
    warned = [r.getMessage() for r in caplog.records if "max_tasks" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "limit of 1 tasks" in warned[0] and "--max-tasks" in warned[0]


async def test_a_server_at_its_connection_limit_logs_one_warning_naming_max_connections(caplog) -> None:
    caplog.set_level("WARNING", logger="durable_rollouts.envserver")
    async with serving(make_env(), max_connections=1) as server:
        held = await _served(server.port)
        for _ in range(3):
            await _assert_refused(server.port)
        await held.close()
    warned = [r.getMessage() for r in caplog.records if "max_connections" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "limit of 1 open connections" in warned[0] and "--max-connections" in warned[0]
