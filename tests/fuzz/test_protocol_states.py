"""Protocol-state fuzzing: random sequences of valid methods over several real connections.

A hypothesis ``RuleBasedStateMachine`` opens connections, says hello (right, wrong or no token),
resumes known, parked, live, closed and unknown session ids, starts, grades, cancels, says bye,
drops connections (FIN or reset), opens tunnels and sends garbage, while a model predicts every
outcome. After every step: a control session opened at the start still answers within 1 s, the
server's session table matches the model exactly, the number of running task bodies equals the
model's open tasks, and no connection handler crashed. At teardown everything is closed and the
server must hold nothing but the control session; a separate test checks the park TTL.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fuzz_support import ServerThread, SyncConn, predict, check_reply
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

TOKEN = "fuzz-token-1"
WORDS = ("abc", "w", "zz")


@dataclass
class SessionModel:
    state: str  # "live" | "parked" | "closed"
    runner: tuple[str, Any] | None = None  # ("open", word) or ("graded", result)


@dataclass
class ConnModel:
    conn: SyncConn
    authorized: bool = False
    session: str | None = None


garbage_lines = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"[1,2]", b"42", b'"hello"', b"null", b"{", b'{"id":1', b"NaN"]),
    st.builds(
        lambda has_id, name: json.dumps(
            {"jsonrpc": "2.0", **({"id": 77} if has_id else {}), "method": name, "params": {}}
        ).encode(),
        st.booleans(),
        st.text(max_size=10).filter(lambda m: m not in {"hello", "tasks.list", "tasks.start", "tasks.grade",
                                                       "tasks.cancel", "bye", "tunnel.open"}),
    ),
)
"""Lines that must never change session state: bad JSON, non-objects, unknown methods."""


def make_machine(server: ServerThread, control: SyncConn, token: str | None) -> type[RuleBasedStateMachine]:
    class ControlChannelMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.conns: dict[int, ConnModel] = {}
            self.sessions: dict[str, SessionModel] = {}
            self.next_conn = 0

        # -- helpers --------------------------------------------------------------------------

        def pick(self, index: int) -> tuple[int, ConnModel]:
            keys = sorted(self.conns)
            key = keys[index % len(keys)]
            return key, self.conns[key]

        def needs_auth(self, c: ConnModel) -> bool:
            return token is not None and not c.authorized and c.session is None

        def expect_error(self, reply: dict[str, Any], code: int) -> None:
            assert "error" in reply and reply["error"]["code"] == code, (code, reply)

        def learn_session(self, c: ConnModel) -> None:
            """A non-hello call created a session implicitly: learn its id with hello{}."""
            if c.session is None:
                result = c.conn.call("hello", {"token": token} if token else {})["result"]
                c.session = result["session_id"]
                assert c.session not in self.sessions
                self.sessions[c.session] = SessionModel("live")

        def drop(self, key: int) -> None:
            self.conns.pop(key).conn.close()

        # -- rules ----------------------------------------------------------------------------

        @precondition(lambda self: len(self.conns) < 4)
        @rule()
        def open_connection(self) -> None:
            self.conns[self.next_conn] = ConnModel(SyncConn(server.port))
            self.next_conn += 1

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), kind=st.sampled_from(["right", "wrong", "none"]))
        def hello(self, i: int, kind: str) -> None:
            _, c = self.pick(i)
            params = {"right": {"token": token or "x"}, "wrong": {"token": "wrong-token"}, "none": {}}[kind]
            reply = c.conn.call("hello", params)
            if token is not None and not c.authorized and kind != "right":
                self.expect_error(reply, -32001)
                return
            c.authorized = True
            sid = reply["result"]["session_id"]
            if c.session is not None:
                assert sid == c.session
            else:
                assert sid not in self.sessions
                c.session = sid
                self.sessions[sid] = SessionModel("live")

        @precondition(lambda self: self.conns)
        @rule(
            i=st.integers(0, 3),
            kind=st.sampled_from(["unknown", "closed", "parked", "live", "own"]),
            pick=st.integers(0, 100),
        )
        def resume(self, i: int, kind: str, pick: int) -> None:
            _, c = self.pick(i)
            wanted = {"closed": "closed", "parked": "parked", "live": "live"}.get(kind)
            candidates = sorted(s for s, m in self.sessions.items() if m.state == wanted and s != c.session)
            if kind == "own" and c.session is not None:
                target = c.session
            elif candidates:
                target = candidates[pick % len(candidates)]
            else:
                target, kind = f"sess-{secrets.token_hex(8)}", "unknown"
            reply = c.conn.call("hello", {"session_id": target, **({"token": token} if token else {})})
            c.authorized = True
            if kind == "own" and c.session is not None:
                assert reply["result"]["session_id"] == target
            elif self.sessions.get(target, SessionModel("closed")).state != "parked":
                self.expect_error(reply, -32600)
            else:
                assert reply["result"]["session_id"] == target, reply
                if c.session is not None:
                    self.sessions[c.session].state = "parked"
                self.sessions[target].state = "live"
                c.session = target

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), kind=st.sampled_from(["echo", "echo", "unknown", "badargs", "boom"]),
              word=st.sampled_from(WORDS))
        def start(self, i: int, kind: str, word: str) -> None:
            _, c = self.pick(i)
            params = {
                "echo": {"id": "echo", "args": {"word": word}},
                "unknown": {"id": "nope"},
                "badargs": {"id": "echo", "args": {"wrod": word}},
                "boom": {"id": "boom"},
            }[kind]
            reply = c.conn.call("tasks.start", params)
            if self.needs_auth(c):
                self.expect_error(reply, -32001)
                return
            self.learn_session(c)
            model = self.sessions[c.session]  # type: ignore[index]
            if kind == "echo":
                assert reply["result"] == {"prompt": f"say {word}"}, reply
                model.runner = ("open", word)
            elif kind == "boom":
                self.expect_error(reply, -32000)
                model.runner = None
            else:
                self.expect_error(reply, -32602)

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), answer=st.sampled_from(WORDS))
        def grade(self, i: int, answer: str) -> None:
            _, c = self.pick(i)
            reply = c.conn.call("tasks.grade", {"answer": answer})
            if self.needs_auth(c):
                self.expect_error(reply, -32001)
                return
            own = self.sessions[c.session].runner if c.session is not None else None
            if own is not None:
                if own[0] == "open":
                    assert reply["result"] == {"score": 1.0 if answer == own[1] else 0.0}, reply
                    self.sessions[c.session].runner = ("graded", reply["result"])  # type: ignore[index]
                else:
                    assert reply["result"] == own[1], reply  # idempotent: the cached grade
                return
            parked = [s for s, m in self.sessions.items() if m.state == "parked" and m.runner and m.runner[0] == "open"]
            if len(parked) != 1:
                self.expect_error(reply, -32600)
                self.learn_session(c)
                return
            adopted = self.sessions[parked[0]]
            assert adopted.runner is not None
            assert reply["result"] == {"score": 1.0 if answer == adopted.runner[1] else 0.0}, reply
            adopted.runner = ("graded", reply["result"])
            adopted.state = "live"
            if c.session is not None:
                self.sessions[c.session].state = "closed"
            c.session = parked[0]

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), method=st.sampled_from(["tasks.cancel", "tasks.list"]))
        def cancel_or_list(self, i: int, method: str) -> None:
            _, c = self.pick(i)
            reply = c.conn.call(method)
            if self.needs_auth(c):
                self.expect_error(reply, -32001)
                return
            assert "result" in reply, reply
            self.learn_session(c)
            if method == "tasks.cancel":
                self.sessions[c.session].runner = None  # type: ignore[index]

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3))
        def bye(self, i: int) -> None:
            key, c = self.pick(i)
            reply = c.conn.call("bye")
            if self.needs_auth(c):
                self.expect_error(reply, -32001)
                return
            assert reply["result"] == {"goodbye": True}
            assert c.conn.read_line(2.0) is None, "bye must close the connection"
            if c.session is not None:
                self.sessions[c.session] = SessionModel("closed")
            self.drop(key)

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), reset=st.booleans())
        def disconnect(self, i: int, reset: bool) -> None:
            key, c = self.pick(i)
            c.conn.abort() if reset else c.conn.close()
            self.conns.pop(key)
            if c.session is not None:
                sid = c.session
                assert server.wait_until(lambda: server.session_states().get(sid) == "parked", 2.0)
                self.sessions[sid].state = "parked"

        @rule(word=st.sampled_from(WORDS), reset=st.booleans())
        def park_a_task(self, word: str, reset: bool) -> None:
            """Shortcut to the interesting states: a fresh connection starts a task and drops."""
            key = self.next_conn
            self.conns[key] = ConnModel(SyncConn(server.port))
            self.next_conn += 1
            index = sorted(self.conns).index(key)
            if token is not None:
                self.hello(index, "right")
            self.start(index, "echo", word)
            self.disconnect(index, reset)

        @precondition(lambda self: self.conns)
        @rule(i=st.integers(0, 3), line=garbage_lines)
        def garbage(self, i: int, line: bytes) -> None:
            _, c = self.pick(i)
            expect = predict(line, first=False)
            started = time.monotonic()
            assert c.conn.send_line(line)
            if expect.reply:
                got = c.conn.read_line()
                assert got is not None
                check_reply(got, expect.id, started, expect.codes)

        @rule(capability=st.sampled_from(["echo", "nope"]), kind=st.sampled_from(["right", "wrong", "none"]))
        def tunnel(self, capability: str, kind: str) -> None:
            conn = SyncConn(server.port)
            try:
                params: dict[str, Any] = {"capability": capability}
                if kind != "none":
                    params["token"] = (token or "x") if kind == "right" else "wrong"
                reply = conn.call("tunnel.open", params)
                if token is not None and kind != "right":
                    self.expect_error(reply, -32001)
                elif capability == "nope":
                    self.expect_error(reply, -32602)
                else:
                    assert reply["result"] == {"capability": "echo"}
                    assert conn.send_line(b"through the tunnel")
                    assert conn.read_line() == b"through the tunnel"
                    return
                assert conn.read_line() is None, "a refused tunnel must close"
            finally:
                conn.close()

        # -- invariants -----------------------------------------------------------------------

        @invariant()
        def control_session_answers_within_a_second(self) -> None:
            assert "result" in control.call("tasks.list", timeout=1.0)

        @invariant()
        def server_state_matches_the_model(self) -> None:
            server.assert_healthy()
            states = server.session_states()
            states.pop(control_id, None)
            expected = {s: m.state for s, m in self.sessions.items() if m.state != "closed"}
            assert states == expected
            open_tasks = sum(1 for m in self.sessions.values() if m.state != "closed" and m.runner and m.runner[0] == "open")
            assert server.call(lambda: server.live["bodies"]) == open_tasks

        def teardown(self) -> None:
            for key in list(self.conns):
                c = self.conns[key]
                try:
                    if self.needs_auth(c):
                        c.conn.call("hello", {"token": token})
                    c.conn.call("bye")
                finally:
                    self.drop(key)
            for sid, m in self.sessions.items():
                if m.state == "parked":
                    conn = SyncConn(server.port)
                    try:
                        conn.call("hello", {"session_id": sid, **({"token": token} if token else {})})
                        conn.call("bye")
                    finally:
                        conn.close()
            assert server.wait_until(lambda: set(server.session_states()) == {control_id}, 2.0), server.session_states()
            assert server.runner_count() == 0 and server.live["bodies"] == 0

    control_id = control.call("hello", {"token": token} if token else {})["result"]["session_id"]
    return ControlChannelMachine


@pytest.fixture(params=[None, TOKEN], ids=["no-token", "token"])
def machine_server(request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, SyncConn, str | None]]:
    token = request.param
    with ServerThread(token=token) as server:
        control = SyncConn(server.port)
        try:
            yield server, control, token
            control.call("bye")
        finally:
            control.close()
        assert server.wait_until(lambda: not server.session_states(), 2.0)
        assert server.runner_count() == 0 and server.live["bodies"] == 0
        server.assert_healthy()


def test_random_method_sequences_keep_the_server_consistent(
    machine_server: tuple[ServerThread, SyncConn, str | None],
) -> None:
    server, control, token = machine_server
    machine = make_machine(server, control, token)
    machine.TestCase.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    machine.TestCase().runTest()


def test_parked_sessions_expire_after_the_ttl_and_tear_their_tasks_down() -> None:
    with ServerThread(park_ttl_s=0.3) as server:
        for word in WORDS:
            conn = SyncConn(server.port)
            assert "result" in conn.call("tasks.start", {"id": "echo", "args": {"word": word}})
            conn.abort() if word == "w" else conn.close()
        assert server.wait_until(lambda: len(server.session_states()) == 3, 2.0)
        assert server.live["bodies"] == 3
        assert server.wait_until(lambda: not server.session_states(), 3.0), server.session_states()
        assert server.runner_count() == 0 and server.live["bodies"] == 0
        server.assert_healthy()
