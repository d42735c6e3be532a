"""The control-channel wire protocol: one neutral module shared by server and client.

Newline-delimited JSON-RPC 2.0 over one TCP port. This module holds everything both sides must
agree on — method names, error codes, parameter/result models, the port announcement — plus a
sans-I/O :class:`LineProtocol` that turns bytes into frames and frames into bytes. It performs no
I/O and imports neither ``envserver`` nor ``sdk`` (both import it).

Typical use by an I/O adapter::

    proto = LineProtocol(max_line_bytes=16 * 2**20)
    proto.receive_data(chunk)
    for event in proto.events_received():
        ...                     # dict frames, or FrameError for a bad line
    writer.write(proto.data_to_send())
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import (
    ProtocolError,
    RemoteTaskError,
    ServerBusyError,
    UnauthorizedError,
)
from .settings import SERVE_PORT_VAR

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "ErrorCode",
    "FEATURE_START_KEY",
    "FrameError",
    "GradeParams",
    "HelloParams",
    "HelloResult",
    "LineProtocol",
    "Method",
    "PROTOCOL_VERSION",
    "RESUMED_SESSION",
    "SERVER_FEATURES",
    "SERVE_PORT_ANNOUNCEMENT",
    "SUPPORTED_PROTOCOLS",
    "StartParams",
    "TunnelOpenParams",
    "error_frame",
    "error_from_frame",
    "request_frame",
    "result_frame",
    "valid_request_id",
]

PROTOCOL_VERSION = "1"
"""Bumped on any incompatible wire change; the client rejects a server speaking another."""

SUPPORTED_PROTOCOLS: tuple[str, ...] = (PROTOCOL_VERSION,)
"""Versions this side speaks, preferred first. A HUD v6 peer names none: its hello carries no
``protocol`` and its hello reply has no ``protocol`` member (that is how a client tells a HUD
server from ours)."""

FEATURE_START_KEY = "start_key"
"""``tasks.start`` takes a ``start_key``: a start repeated under the same key (a replayed start
step) moves the connection into the session that already started it and returns its prompt
frame again, plus ``RESUMED_SESSION``, instead of running the task's setup a second time."""

SERVER_FEATURES: tuple[str, ...] = (FEATURE_START_KEY,)
"""Optional extensions this server takes, named in its ``hello`` reply (``features``); a client
uses one only when the server names it (older servers and HUD's name none)."""

RESUMED_SESSION = "resumed_session"
"""The member a repeated keyed ``tasks.start`` adds to the prompt frame: the session it moved to."""

SERVE_PORT_ANNOUNCEMENT = f"{SERVE_PORT_VAR}="
"""Printed once by ``serve`` (followed by the port) after hooks ran and the port is bound."""

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class Method(StrEnum):
    """Every method of the control channel."""

    HELLO = "hello"
    TASKS_LIST = "tasks.list"
    TASKS_START = "tasks.start"
    TASKS_GRADE = "tasks.grade"
    TASKS_CANCEL = "tasks.cancel"
    BYE = "bye"
    TUNNEL_OPEN = "tunnel.open"


class ErrorCode:
    """JSON-RPC error codes used on the wire."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_ERROR = -32000
    UNAUTHORIZED = -32001
    BUSY = -32002  # at the connection or task limit: transient, retry later


# ---------------------------------------------------------------------------------------------
# Parameter and result models (validated once at the boundary)


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HelloParams(BaseModel):
    """``hello``: open a new session, or resume a parked one by id.

    ``protocol``: the version the client speaks, or a list of them (preferred first); the reply
    names the one chosen. ``workspace_routes`` and ``connections`` are what a HUD v6 client sends
    when it brings a HUD workspace: checked to be lists (-32602 otherwise, as HUD's own server
    does) and otherwise ignored, as is any other parameter a newer client may add.
    """

    model_config = ConfigDict(extra="ignore")

    session_id: str | None = None
    token: str | None = None
    protocol: str | list[str] | None = None
    workspace_routes: list[Any] = Field(default_factory=list)
    connections: list[Any] = Field(default_factory=list)

    def negotiate(self) -> str | None:
        """The version to speak: the client's first one this side supports (ours when the client
        names none); None when there is nothing in common."""
        if self.protocol is None:
            return PROTOCOL_VERSION
        offered = [self.protocol] if isinstance(self.protocol, str) else self.protocol
        return next((v for v in offered if v in SUPPORTED_PROTOCOLS), None)


class EnvInfo(BaseModel):
    name: str
    version: str


class HelloResult(BaseModel):
    """Reply to ``hello``."""

    session_id: str
    env: EnvInfo
    bindings: list[dict[str, Any]] = Field(default_factory=list)
    protocol: str = PROTOCOL_VERSION
    features: list[str] = Field(default_factory=list)


class StartParams(_Params):
    """``tasks.start``: start task ``id`` with ``args``; ``start_key`` (``FEATURE_START_KEY``)
    makes a repeated start under the same key return the first one's prompt."""

    id: str
    args: dict[str, Any] = Field(default_factory=dict)
    start_key: str | None = Field(default=None, min_length=1, max_length=512)


class GradeParams(BaseModel):
    """``tasks.grade``: the agent's answer plus any extra keys the task wants to see."""

    model_config = ConfigDict(extra="allow")

    answer: Any = None


class TunnelOpenParams(_Params):
    """``tunnel.open`` (first frame only): turn this connection into a byte pipe."""

    capability: str
    token: str | None = None


# ---------------------------------------------------------------------------------------------
# Frame constructors and error mapping


def request_frame(id: int | str | None, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build a JSON-RPC request (a notification when ``id`` is None)."""
    frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if id is not None:
        frame["id"] = id
    return frame


def result_frame(id: int | str | None, result: Any) -> dict[str, Any]:
    """Build a JSON-RPC success reply."""
    return {"jsonrpc": "2.0", "id": id, "result": result}


def error_frame(id: int | str | None, code: int, message: str) -> dict[str, Any]:
    """Build a JSON-RPC error reply."""
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}


_CODE_TO_ERROR: dict[int, type[ProtocolError]] = {
    ErrorCode.UNAUTHORIZED: UnauthorizedError,
    ErrorCode.TASK_ERROR: RemoteTaskError,
    ErrorCode.BUSY: ServerBusyError,
}


def error_from_frame(error: Any) -> ProtocolError:
    """Turn the ``error`` member of a reply into the matching exception."""
    if not isinstance(error, dict):
        return ProtocolError(ErrorCode.INTERNAL_ERROR, f"malformed error member: {error!r}")
    code = error.get("code")
    message = str(error.get("message", ""))
    if not isinstance(code, int):
        return ProtocolError(ErrorCode.INTERNAL_ERROR, f"malformed error code: {code!r}")
    return _CODE_TO_ERROR.get(code, ProtocolError)(code, message)


# ---------------------------------------------------------------------------------------------
# Sans-I/O framing


@dataclass(frozen=True)
class FrameError:
    """A line that could not become a frame. ``fatal`` means the connection must close."""

    code: int
    message: str
    fatal: bool = False
    id: int | str | None = None


class LineProtocol:
    """Newline-delimited JSON framing with a line-size cap; no I/O.

    Feed bytes with :meth:`receive_data` / :meth:`receive_eof`, pull parsed frames with
    :meth:`events_received`, queue frames with :meth:`send` and pull bytes with
    :meth:`data_to_send`. A line longer than ``max_line_bytes`` yields a fatal
    :class:`FrameError` and everything after it is ignored.

    ``frame_limit`` stops parsing after that many lines became events: every later byte stays
    raw in the buffer (complete lines included) until :meth:`take_buffered` or
    :meth:`lift_frame_limit`. A connection that may switch to a byte pipe after its first frame
    (``tunnel.open``) uses ``frame_limit=1`` so no tunnelled byte is ever parsed as a frame.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, *, frame_limit: int | None = None) -> None:
        self.max_line_bytes = max_line_bytes
        self.frame_limit = frame_limit
        self._lines_parsed = 0
        self._buffer = bytearray()
        self._events: list[dict[str, Any] | FrameError] = []
        self._out = bytearray()
        self.eof = False
        self.broken = False

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the peer."""
        if self.broken or self.eof:
            return
        self._buffer += data
        while not self.broken and not self._holding():
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > self.max_line_bytes:
                    self._break(f"frame exceeds {self.max_line_bytes} bytes")
                return
            if newline > self.max_line_bytes:
                self._break(f"frame exceeds {self.max_line_bytes} bytes")
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            self._parse(line)

    def receive_eof(self) -> None:
        """The peer closed its side; a trailing unterminated line is parsed as a frame."""
        if self.broken or self.eof:
            return
        if self._buffer.strip() and not self._holding():
            line = bytes(self._buffer)
            self._buffer.clear()
            self._parse(line)
        self.eof = True

    def events_received(self) -> list[dict[str, Any] | FrameError]:
        """Frames (dicts) and framing errors received since the last call."""
        events, self._events = self._events, []
        return events

    def send(self, frame: dict[str, Any]) -> None:
        """Queue one frame for sending."""
        self._out += encode_frame(frame)

    def data_to_send(self) -> bytes:
        """Bytes queued for the peer since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def take_buffered(self) -> bytes:
        """Every byte received but not parsed (used when a tunnel takes over the connection)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def lift_frame_limit(self) -> None:
        """Resume parsing without a limit (the connection stays a frame stream)."""
        self.frame_limit = None
        pending = bytes(self._buffer)
        self._buffer.clear()
        if pending:
            self.receive_data(pending)

    def _holding(self) -> bool:
        return self.frame_limit is not None and self._lines_parsed >= self.frame_limit

    def _break(self, message: str) -> None:
        self.broken = True
        self._buffer.clear()
        self._events.append(FrameError(ErrorCode.INVALID_REQUEST, message, fatal=True))

    def _parse(self, line: bytes) -> None:
        if not line.strip():
            return
        self._lines_parsed += 1
        try:
            frame = json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as exc:
            self._events.append(FrameError(ErrorCode.PARSE_ERROR, f"invalid JSON: {exc}"))
            return
        if not isinstance(frame, dict):
            self._events.append(FrameError(ErrorCode.INVALID_REQUEST, "a frame must be a JSON object"))
            return
        self._events.append(frame)


def encode_frame(frame: dict[str, Any]) -> bytes:
    """One compact JSON line terminated by ``\\n``.

    Raises ``ValueError`` for NaN/Infinity (not JSON) and ``RecursionError`` for absurd nesting.
    Strings with lone surrogates (legal in JSON only as ``\\u`` escapes) are sent escaped.
    """
    text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(frame, separators=(",", ":"), allow_nan=False, default=str).encode() + b"\n"


def valid_request_id(value: Any) -> bool:
    """JSON-RPC 2.0 ids are strings, numbers or null (a bool is not a number here)."""
    return value is None or isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value
