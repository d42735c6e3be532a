"""The control-channel server over real loopback sockets: methods, error codes, sessions."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from envserver_helpers import make_env

from durable_rollouts.envserver import Environment, EnvServer, serving
from durable_rollouts.envserver.sessions import Session, SessionState
from durable_rollouts.errors import ConfigError, InvalidStateError


async def test_hello_returns_session_env_bindings_and_protocol(raw: Any) -> None:
    conn = await raw()
    result = await conn.result("hello", {})
    assert result["session_id"].startswith("sess-")
    assert result["env"] == {"name": "testenv", "version": "2.0.0"}
    assert result["bindings"] == [] and result["protocol"] == "1"


async def test_tasks_list_describes_every_template(raw: Any) -> None:
    conn = await raw()
    tasks = (await conn.result("tasks.list"))["tasks"]
    by_id = {t["id"]: t for t in tasks}
    assert set(by_id) == {"count", "typed", "noscore", "badscore", "boom", "kw"}
    assert by_id["count"]["description"] == "Count a letter."
    assert by_id["typed"]["args"]["required"] == ["n"]


async def test_start_then_grade_runs_the_task_and_its_teardown(raw: Any, env_log: list[str]) -> None:
    conn = await raw()
    assert await conn.result("tasks.start", {"id": "count", "args": {"word": "banana"}}) == {
        "prompt": "count a in banana"
    }
    assert await conn.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
    assert env_log == ["start:banana", "grade:3", "teardown:banana"]


async def test_dict_prompts_pass_unchanged_and_string_args_are_coerced(raw: Any) -> None:
    conn = await raw()
    prompt = await conn.result("tasks.start", {"id": "typed", "args": {"n": "4", "items": "[1]"}})
    assert prompt == {"prompt": "typed", "got": [4, [1], False]}
    graded = await conn.result("tasks.grade", {"answer": {"x": 1}})
    assert graded == {"score": 0.5, "subscores": [{"name": "a", "value": 1.0}], "extra": {"x": 1}}


async def test_a_task_without_a_second_yield_scores_zero(raw: Any) -> None:
    conn = await raw()
    await conn.result("tasks.start", {"id": "noscore"})
    assert await conn.result("tasks.grade", {"answer": "x"}) == {"score": 0.0}


async def test_task_errors_and_non_numeric_grades_are_32000(raw: Any) -> None:
    conn = await raw()
    assert await conn.error_code("tasks.start", {"id": "boom"}) == -32000
    await conn.result("tasks.start", {"id": "boom", "args": {"when": "grade"}})
    reply = await conn.call("tasks.grade", {"answer": 1})
    assert reply["error"]["code"] == -32000 and "exploded at grade" in reply["error"]["message"]
    await conn.result("tasks.start", {"id": "badscore"})
    assert await conn.error_code("tasks.grade", {"answer": 1}) == -32000


async def test_bad_params_unknown_tasks_and_bad_arguments_are_32602(raw: Any, env_log: list[str]) -> None:
    conn = await raw()
    assert await conn.error_code("tasks.start", {"id": "nope"}) == -32602
    assert await conn.error_code("tasks.start", {"id": "count", "args": "notadict"}) == -32602
    assert await conn.error_code("tasks.start", {"args": {}}) == -32602
    assert await conn.error_code("tasks.start", {"id": "count", "args": {"wrd": "x"}}) == -32602
    assert await conn.error_code("tasks.start", {"id": "typed", "args": {"n": "many"}}) == -32602
    assert await conn.error_code("hello", {"session_id": 5}) == -32602
    await conn.send({"jsonrpc": "2.0", "id": 99, "method": "tasks.list", "params": [1]})
    assert (await conn.recv())["error"]["code"] == -32602
    assert env_log == []  # no task body ran


async def test_unknown_methods_bad_json_and_non_object_frames_get_their_codes(raw: Any) -> None:
    conn = await raw()
    assert await conn.error_code("tasks.frobnicate") == -32601
    await conn.send_bytes(b"{nope\n")
    assert (await conn.recv())["error"]["code"] == -32700
    await conn.send_bytes(b"[1, 2]\n")
    assert (await conn.recv())["error"]["code"] == -32600
    await conn.send({"jsonrpc": "2.0", "id": 3})
    assert (await conn.recv())["error"]["code"] == -32600


async def test_frames_without_id_get_no_reply(raw: Any) -> None:
    conn = await raw()
    await conn.send({"jsonrpc": "2.0", "method": "tasks.start", "params": {"id": "count"}})
    await conn.send({"jsonrpc": "2.0", "method": "no.such.method"})
    reply = await conn.call("tasks.grade", {"answer": "3"})
    assert reply["result"] == {"score": 1.0}  # the notification started the task, nothing else came back


async def test_grade_without_any_task_is_32600(raw: Any) -> None:
    conn = await raw()
    assert await conn.error_code("tasks.grade", {"answer": "1"}) == -32600


async def test_cancel_tears_down_the_task_and_bye_closes_the_connection(raw: Any, env_log: list[str]) -> None:
    conn = await raw()
    await conn.result("tasks.start", {"id": "count", "args": {"word": "kiwi"}})
    assert await conn.result("tasks.cancel") == {"cancelled": True}
    assert env_log == ["start:kiwi", "teardown:kiwi"]
    assert await conn.error_code("tasks.grade", {"answer": "0"}) == -32600
    assert await conn.result("bye") == {"goodbye": True}
    assert await conn.closed_by_server()


async def test_restart_in_one_session_replaces_only_that_sessions_task(raw: Any, env_log: list[str]) -> None:
    a, b = await raw(), await raw()
    await a.result("tasks.start", {"id": "count", "args": {"word": "aaa"}})
    await b.result("tasks.start", {"id": "count", "args": {"word": "bab"}})
    await a.result("tasks.start", {"id": "count", "args": {"word": "aa"}})
    assert "teardown:aaa" in env_log and "teardown:bab" not in env_log
    assert await b.result("tasks.grade", {"answer": "1"}) == {"score": 1.0}
    assert await a.result("tasks.grade", {"answer": "2"}) == {"score": 1.0}


async def test_repeated_grade_returns_the_cached_result_without_regrading(raw: Any, server: EnvServer) -> None:
    conn = await raw()
    await conn.result("tasks.start", {"id": "count"})
    first = await conn.result("tasks.grade", {"answer": "3"})
    second = await conn.result("tasks.grade", {"answer": "wrong now"})
    assert first == second == {"score": 1.0}
    assert server.grade_count == 1


async def test_a_dropped_connection_parks_its_session_and_hello_resumes_it(raw: Any, server: EnvServer) -> None:
    first = await raw()
    sid = (await first.result("hello", {}))["session_id"]
    await first.result("tasks.start", {"id": "count"})
    await first.close()
    await asyncio.sleep(0.05)
    second = await raw()
    assert (await second.result("hello", {"session_id": sid}))["session_id"] == sid
    assert await second.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
    # a retried grade after a lost reply: resume again and get the same answer
    await second.close()
    await asyncio.sleep(0.05)
    third = await raw()
    await third.result("hello", {"session_id": sid})
    assert await third.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
    assert server.grade_count == 1


async def test_a_session_without_a_task_also_survives_a_disconnect(raw: Any) -> None:
    first = await raw()
    sid = (await first.result("hello", {}))["session_id"]
    await first.close()
    await asyncio.sleep(0.05)
    second = await raw()
    assert (await second.result("hello", {"session_id": sid}))["session_id"] == sid


async def test_unknown_and_live_session_ids_are_rejected(raw: Any) -> None:
    live = await raw()
    sid = (await live.result("hello", {}))["session_id"]
    other = await raw()
    assert await other.error_code("hello", {"session_id": sid}) == -32600
    assert await other.error_code("hello", {"session_id": "sess-unknown"}) == -32600
    assert (await live.result("hello", {"session_id": sid}))["session_id"] == sid  # keepalive no-op


async def test_plain_grade_adopts_the_lone_parked_task(raw: Any) -> None:
    first = await raw()
    await first.result("tasks.start", {"id": "count", "args": {"word": "xxyx"}})
    await first.close()
    await asyncio.sleep(0.05)
    second = await raw()
    assert await second.result("tasks.grade", {"answer": "0"}) == {"score": 1.0}


async def test_two_parked_tasks_make_an_adopting_grade_fail_listing_their_ids(raw: Any) -> None:
    ids = []
    for word in ("one", "two"):
        conn = await raw()
        ids.append((await conn.result("hello", {}))["session_id"])
        await conn.result("tasks.start", {"id": "count", "args": {"word": word}})
        await conn.close()
    await asyncio.sleep(0.05)
    grader = await raw()
    reply = await grader.call("tasks.grade", {"answer": "1"})
    assert reply["error"]["code"] == -32600
    assert all(sid in reply["error"]["message"] for sid in ids)


async def test_parked_sessions_expire_after_the_ttl_and_run_their_teardown() -> None:
    log: list[str] = []
    async with serving(make_env(log), park_ttl_s=0.2) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b'{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"count","args":{"word":"ttl"}}}\n')
        assert b"prompt" in await reader.readline()
        writer.close()
        await asyncio.sleep(0.6)
        assert log == ["start:ttl", "teardown:ttl"]
        assert srv.sessions.parked_with_task() == []


async def test_token_is_required_when_configured() -> None:
    async with serving(make_env(), token="s3cret") as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            async def call(frame: bytes) -> dict[str, Any]:
                writer.write(frame + b"\n")
                return json.loads(await reader.readline())

            assert (await call(b'{"jsonrpc":"2.0","id":1,"method":"tasks.list"}'))["error"]["code"] == -32001
            bad = b'{"jsonrpc":"2.0","id":2,"method":"hello","params":{"token":"wrong"}}'
            assert (await call(bad))["error"]["code"] == -32001
            good = b'{"jsonrpc":"2.0","id":3,"method":"hello","params":{"token":"s3cret"}}'
            assert "session_id" in (await call(good))["result"]
            assert "tasks" in (await call(b'{"jsonrpc":"2.0","id":4,"method":"tasks.list"}'))["result"]
        finally:
            writer.close()


async def test_binding_beyond_loopback_without_a_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="token"):
        async with serving(Environment(), host="0.0.0.0"):
            pass


async def test_an_oversize_frame_gets_an_error_then_the_connection_closes() -> None:
    async with serving(make_env(), max_line_bytes=1024) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(b'{"jsonrpc":"2.0","id":1,"method":"hello","params":{"x":"' + b"y" * 4096)
            reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
            assert reply["error"]["code"] == -32600 and "exceeds" in reply["error"]["message"]
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            writer.close()


async def test_a_stuck_client_does_not_block_other_sessions() -> None:
    env = Environment(name="slow")
    release = asyncio.Event()

    @env.template()
    async def hang():
        await release.wait()
        yield "never mind"

    @env.template()
    async def quick():
        yield "q"
        yield 1.0

    async with serving(env) as srv:
        r1, w1 = await asyncio.open_connection("127.0.0.1", srv.port)
        w1.write(b'{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"hang"}}\n')
        w2 = None
        try:
            r2, w2 = await asyncio.open_connection("127.0.0.1", srv.port)
            w2.write(b'{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"quick"}}\n')
            assert b'"q"' in await asyncio.wait_for(r2.readline(), 2)
            w2.write(b'{"jsonrpc":"2.0","id":2,"method":"tasks.grade","params":{"answer":1}}\n')
            assert b'"score":1.0' in await asyncio.wait_for(r2.readline(), 2)
        finally:
            release.set()
            w1.close()
            if w2 is not None:
                w2.close()


async def test_concurrent_sessions_keep_independent_tasks(raw: Any) -> None:
    conns = [await raw() for _ in range(5)]
    words = ["a", "aa", "aaa", "aaaa", "aaaaa"]
    await asyncio.gather(
        *(c.result("tasks.start", {"id": "count", "args": {"word": w}}) for c, w in zip(conns, words))
    )
    results = await asyncio.gather(*(c.result("tasks.grade", {"answer": str(len(w))}) for c, w in zip(conns, words)))
    assert results == [{"score": 1.0}] * 5


async def test_shutdown_tears_down_parked_and_live_tasks_then_runs_stop_hooks() -> None:
    log: list[str] = []
    env = make_env(log)
    env.shutdown(lambda: log.append("shutdown-hook"))
    async with serving(env) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b'{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"count","args":{"word":"z"}}}\n')
        await reader.readline()
    writer.close()
    assert log == ["start:z", "teardown:z", "shutdown-hook"]


async def test_an_adopted_task_keeps_its_session_id_so_a_retry_gets_the_cached_grade(
    raw: Any, server: EnvServer
) -> None:
    first = await raw()
    sid = (await first.result("hello", {}))["session_id"]
    await first.result("tasks.start", {"id": "count"})
    await first.close()
    await asyncio.sleep(0.05)
    adopter = await raw()
    assert await adopter.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
    await adopter.close()
    await asyncio.sleep(0.05)
    retry = await raw()
    await retry.result("hello", {"session_id": sid})
    assert await retry.result("tasks.grade", {"answer": "3"}) == {"score": 1.0}
    assert server.grade_count == 1


def test_session_state_transitions_are_enforced() -> None:
    session = Session("sess-x")
    assert session.state is SessionState.LIVE
    session.transition(SessionState.PARKED)
    with pytest.raises(InvalidStateError):
        session.transition(SessionState.PARKED)
    session.transition(SessionState.CLOSED)
    with pytest.raises(InvalidStateError):
        session.transition(SessionState.LIVE)


async def test_a_port_that_cannot_be_bound_still_runs_the_shutdown_hooks() -> None:
    import socket

    calls: list[str] = []
    env = Environment()
    env.initialize(lambda: calls.append("up"))
    env.shutdown(lambda: calls.append("down"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            async with serving(env, port=taken.getsockname()[1]):
                pass
    assert calls == ["up", "down"]
