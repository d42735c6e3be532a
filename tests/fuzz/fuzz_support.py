"""Fuzzing harness for the control channel: a real server in a thread, blocking sockets, checks.

The server under test is the real :func:`durable_rollouts.envserver.serving` on 127.0.0.1, run on
its own event loop in a background thread, so hypothesis drives it from ordinary synchronous code
over real sockets. :func:`predict` states, for one line, what the protocol promises (a reply or
none, which id it echoes, whether the connection closes); :func:`check_reply` checks a reply line
against JSON-RPC 2.0 and the documented error codes. :data:`STATS` counts what was sent and seen.

Shared by tests/fuzz and benchmarks/fuzz_long.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_rollouts.envserver import Capability, EnvServer, Environment, serving

DOCUMENTED_CODES = frozenset({-32700, -32600, -32601, -32602, -32603, -32000, -32001})
FUZZ_MAX_LINE = 8192
METHODS = ("hello", "tasks.list", "tasks.start", "tasks.grade", "tasks.cancel", "bye", "tunnel.open")


@dataclass
class Stats:
    """Totals of one fuzzing run."""

    frames: int = 0
    connections: int = 0
    replies: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    max_latency_s: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def reply(self, obj: dict[str, Any], latency_s: float) -> None:
        self.replies += 1
        if "error" in obj:
            self.errors[obj["error"]["code"]] += 1
        self.max_latency_s = max(self.max_latency_s, latency_s)
        self.latencies.append(latency_s)

    def summary(self) -> str:
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(self.errors.items())) or "none"
        ordered = sorted(self.latencies) or [0.0]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (
            f"frames={self.frames} connections={self.connections} replies={self.replies} "
            f"errors by code={{{codes}}} max reply latency={self.max_latency_s * 1000:.1f} ms "
            f"(p99 {p99 * 1000:.1f} ms)"
        )


STATS = Stats()


# ---------------------------------------------------------------------------------------------
# The environment under fuzz


def make_fuzz_env() -> tuple[Environment, Counter[str]]:
    """An environment whose tasks count running bodies in ``live["bodies"]`` (0 = nothing leaked)."""
    live: Counter[str] = Counter()
    env = Environment(name="fuzzenv", version="1.0.0")

    @env.template(description="Say the word back.")
    async def echo(word: str = "abc"):
        live["bodies"] += 1
        try:
            answer = yield f"say {word}"
            yield 1.0 if answer == word else 0.0
        finally:
            live["bodies"] -= 1

    @env.template()
    async def typed(n: int, items: list[int] | None = None, flag: bool = False):
        live["bodies"] += 1
        try:
            answer = yield {"prompt": "typed", "n": n, "items": items, "flag": flag}
            yield {"score": 0.5, "extra": answer}  # echoes arbitrary client JSON back
        finally:
            live["bodies"] -= 1

    @env.template()
    async def boom(when: str = "start"):
        live["bodies"] += 1
        try:
            if when == "start":
                raise RuntimeError("exploded at start")
            yield "p"
            raise RuntimeError("exploded at grade")
        finally:
            live["bodies"] -= 1

    return env, live


# ---------------------------------------------------------------------------------------------
# A real server on its own loop thread


class ServerThread:
    """Run ``serving(env)`` on a background event loop; ``call(fn)`` runs ``fn`` on that loop.

    Unhandled loop exceptions (a crashed connection handler) and ERROR logs of the envserver are
    recorded in ``loop_errors`` / ``error_logs``: a healthy run leaves both empty.
    """

    def __init__(
        self,
        *,
        token: str | list[str] | None = None,
        park_ttl_s: float = 30.0,
        max_line_bytes: int = FUZZ_MAX_LINE,
        echo_capability: bool = True,
    ) -> None:
        self.env, self.live = make_fuzz_env()
        self.token = token
        self.park_ttl_s = park_ttl_s
        self.max_line_bytes = max_line_bytes
        self.echo_capability = echo_capability
        self.server: EnvServer | None = None
        self.port = 0
        self.loop_errors: list[str] = []
        self.error_logs: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fuzz-server", daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._log_handler = _ListHandler(self.error_logs)

    def __enter__(self) -> ServerThread:
        logging.getLogger("durable_rollouts.envserver").addHandler(self._log_handler)
        self._thread.start()
        if not self._ready.wait(15) or self._failure is not None:
            self.__exit__(None, None, None)
            raise RuntimeError(f"fuzz server did not start: {self._failure!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        logging.getLogger("durable_rollouts.envserver").removeHandler(self._log_handler)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(self._on_loop_error)
        self._loop.run_until_complete(self._main())

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.loop_errors.append(f"{context.get('message')}: {context.get('exception')!r}")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        echo: asyncio.Server | None = None
        try:
            if self.echo_capability:
                echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
                port = echo.sockets[0].getsockname()[1]
                self.env.add_capability(Capability(name="echo", protocol="tcp", url=f"tcp://127.0.0.1:{port}"))
            async with serving(
                self.env,
                token=self.token,  # type: ignore[arg-type]
                park_ttl_s=self.park_ttl_s,
                max_line_bytes=self.max_line_bytes,
            ) as server:
                self.server, self.port = server, server.port
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # reported to the starting thread
            self._failure = exc
        finally:
            if echo is not None:
                echo.close()
            self._ready.set()

    def call(self, fn: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Run ``fn()`` on the server's loop (so server state is read without races)."""

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout)

    def session_states(self) -> dict[str, str]:
        """Session id -> state value, read on the server loop."""
        assert self.server is not None
        table = self.server.sessions
        return self.call(lambda: {sid: s.state.value for sid, s in table._sessions.items()})

    def runner_count(self) -> int:
        assert self.server is not None
        table = self.server.sessions
        return self.call(lambda: sum(1 for s in table._sessions.values() if s.runner is not None))

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    def assert_healthy(self) -> None:
        """No connection handler crashed and the envserver logged no error (clears both lists)."""
        problems = self.loop_errors + self.error_logs
        self.loop_errors.clear()
        self.error_logs.clear()
        assert not problems, problems[:5]


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.name}: {record.getMessage()} {record.exc_info[1] if record.exc_info else ''}")


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------------
# Blocking connections


class SyncConn:
    """A blocking socket speaking newline JSON; counts frames and connections in :data:`STATS`."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.eof = False
        self._id = 0
        STATS.connections += 1

    def send_line(self, line: bytes) -> bool:
        """Send one frame (``line`` without its newline); False when the peer already closed."""
        STATS.frames += 1
        try:
            self.sock.sendall(line + b"\n")
        except OSError:
            return False
        return True

    def read_line(self, timeout: float = 5.0) -> bytes | None:
        """The next line from the server, or None at EOF (a reset counts as EOF)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no reply within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"no reply within {timeout} s") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
                if self.buf:
                    raise AssertionError(f"unterminated reply before EOF: {bytes(self.buf[:200])!r}")
                return None
            self.buf += chunk
        newline = self.buf.index(b"\n")
        line = bytes(self.buf[:newline])
        del self.buf[: newline + 1]
        return line

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """Send a request and return its checked reply."""
        self._id += 1
        request_id = f"c{self._id}"
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            frame["params"] = params
        started = time.monotonic()
        assert self.send_line(json.dumps(frame).encode()), f"connection closed before {method}"
        line = self.read_line(timeout)
        assert line is not None, f"server closed the connection instead of answering {method}"
        return check_reply(line, request_id, started)

    def close(self) -> None:
        self.sock.close()

    def abort(self) -> None:
        """Close with a TCP reset (SO_LINGER 0), as a crashed peer would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# What the protocol promises, and checking it


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def strict_loads(data: bytes) -> Any:
    """RFC 8259 JSON only: UTF-8, no NaN/Infinity, no out-of-range numbers."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite)


def valid_id(value: Any) -> bool:
    """JSON-RPC 2.0: an id is a string, a number or null."""
    return value is None or isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool))


@dataclass(frozen=True)
class Expect:
    """What one sent line must cause: a reply (with ``id``, maybe restricted to ``codes``) and/or a close."""

    reply: bool
    id: Any = None
    codes: frozenset[int] | None = None
    closes: bool = False
    blank: bool = False
    piped: bool = False


def predict(line: bytes, *, first: bool, max_line: int = FUZZ_MAX_LINE) -> Expect:
    """The protocol's promise for ``line`` on a token-less server (``first``: first frame of its connection)."""
    if len(line) > max_line:
        return Expect(True, None, frozenset({-32600}), closes=True)
    if not line.strip():
        return Expect(False, blank=True)
    try:
        frame = strict_loads(line)
    except (ValueError, RecursionError):
        return Expect(True, None, frozenset({-32700}))
    if not isinstance(frame, dict):
        return Expect(True, None, frozenset({-32600}))
    has_id = "id" in frame
    if has_id and not valid_id(frame["id"]):
        return Expect(True, None, frozenset({-32600}), closes=first and frame.get("method") == "tunnel.open")
    method = frame.get("method")
    if first and method == "tunnel.open":
        params = frame.get("params")
        piped = (
            isinstance(params, dict)
            and set(params) <= {"capability", "token"}
            and params.get("capability") == "echo"
            and isinstance(params.get("token"), str | None)
        )
        return Expect(has_id, frame.get("id"), None if piped else frozenset({-32602}), closes=True, piped=piped)
    params = frame.get("params")
    closes = method == "bye" and (params is None or isinstance(params, dict))
    return Expect(has_id, frame.get("id"), closes=closes)


def _same_id(got: Any, want: Any) -> bool:
    return type(got) is type(want) and got == want or (
        isinstance(got, int | float) and isinstance(want, int | float) and got == want
    )


def check_reply(line: bytes, expected_id: Any, started: float, codes: frozenset[int] | None = None) -> dict[str, Any]:
    """Check one reply line against JSON-RPC 2.0 and the documented codes; record it in STATS."""
    try:
        obj = strict_loads(line)
    except (ValueError, RecursionError) as exc:
        raise AssertionError(f"reply is not valid JSON ({exc}): {line[:300]!r}") from None
    assert isinstance(obj, dict), f"reply is not an object: {line[:300]!r}"
    assert obj.get("jsonrpc") == "2.0", obj
    assert "id" in obj and _same_id(obj["id"], expected_id), f"reply id {obj.get('id')!r} != {expected_id!r}"
    assert ("result" in obj) != ("error" in obj), f"need exactly one of result/error: {obj}"
    assert set(obj) <= {"jsonrpc", "id", "result", "error"}, obj
    if "error" in obj:
        error = obj["error"]
        assert isinstance(error, dict), obj
        code = error.get("code")
        assert isinstance(code, int) and not isinstance(code, bool), obj
        assert code in DOCUMENTED_CODES, f"undocumented error code {code}"
        assert isinstance(error.get("message"), str), obj
        if codes is not None:
            assert code in codes, f"expected one of {sorted(codes)}, got {error}"
    elif codes is not None:
        raise AssertionError(f"expected an error {sorted(codes)}, got {obj}")
    STATS.reply(obj, time.monotonic() - started)
    return obj


# ---------------------------------------------------------------------------------------------
# Running one fuzz batch


@dataclass
class _ConnRun:
    conn: SyncConn
    first: bool = True
    closing: bool = False
    expects: list[tuple[Expect, float]] = field(default_factory=list)
    piped: bool = False


_sentinels = iter(range(10**12))


def run_batch(port: int, items: list[tuple[int, bytes]], max_line: int = FUZZ_MAX_LINE) -> None:
    """Send ``(connection index, line)`` items interleaved over fresh connections, then check every
    promised reply arrived in order (ids echoed), nothing else arrived (a sentinel request must be
    answered next), and connections promised to close did close."""
    runs: dict[int, _ConnRun] = {}
    try:
        for index, line in items:
            run = runs.get(index)
            if run is None:
                run = runs[index] = _ConnRun(SyncConn(port))
            if run.closing:
                continue
            expect = predict(line, first=run.first, max_line=max_line)
            if not expect.blank:
                run.first = False
            run.expects.append((expect, time.monotonic()))
            run.piped = expect.piped
            run.closing = expect.closes
            if not run.conn.send_line(line):
                assert run.closing, "the server closed a connection it had no reason to close"
        for run in runs.values():
            _finish(run)
    finally:
        for run in runs.values():
            run.conn.close()


def _finish(run: _ConnRun) -> None:
    conn = run.conn
    for expect, started in run.expects:
        if not expect.reply:
            continue
        line = conn.read_line()
        if line is None and expect.closes and expect.id is None:
            return  # an oversized line: the server may reset before the error frame is read
        assert line is not None, f"connection closed; expected a reply with id {expect.id!r}"
        reply = check_reply(line, expect.id, started, expect.codes)
        assert not expect.piped or "result" in reply, f"tunnel.open to the echo capability failed: {reply}"
    if run.piped:  # a tunnel to the echo capability: bytes come back unchanged
        payload = b"piped bytes\n"
        assert conn.send_line(payload[:-1])
        got = b""
        while len(got) < len(payload):
            line = conn.read_line()
            assert line is not None, "tunnel closed early"
            got += line + b"\n"
        assert got == payload
        return
    if run.closing:
        assert conn.read_line() is None, "connection should have been closed"
        return
    sentinel = f"sentinel-{next(_sentinels)}"
    started = time.monotonic()
    conn.send_line(json.dumps({"jsonrpc": "2.0", "id": sentinel, "method": "tasks.list"}).encode())
    line = conn.read_line()
    assert line is not None, "server closed a healthy connection"
    reply = check_reply(line, sentinel, started)
    assert "result" in reply, reply
