"""The sans-I/O LineProtocol: bytes in, frames out, no sockets."""

from __future__ import annotations

import json

import pytest

from durable_rollouts.errors import ProtocolError, RemoteTaskError, UnauthorizedError
from durable_rollouts.protocol import (
    ErrorCode,
    FrameError,
    LineProtocol,
    error_frame,
    error_from_frame,
    request_frame,
)


def test_frames_split_across_chunks_are_reassembled() -> None:
    proto = LineProtocol()
    proto.receive_data(b'{"jsonrpc":"2.0","id":1,')
    assert proto.events_received() == []
    proto.receive_data(b'"method":"hello"}\n{"id":2}\n')
    assert proto.events_received() == [{"jsonrpc": "2.0", "id": 1, "method": "hello"}, {"id": 2}]


def test_invalid_json_yields_a_parse_error_and_later_frames_still_parse() -> None:
    proto = LineProtocol()
    proto.receive_data(b"not json\n[1,2]\n{\"ok\":true}\n")
    bad, not_object, good = proto.events_received()
    assert isinstance(bad, FrameError) and bad.code == ErrorCode.PARSE_ERROR and not bad.fatal
    assert isinstance(not_object, FrameError) and not_object.code == ErrorCode.INVALID_REQUEST
    assert good == {"ok": True}


def test_oversize_line_is_fatal_and_everything_after_is_ignored() -> None:
    proto = LineProtocol(max_line_bytes=16)
    proto.receive_data(b'{"a":"' + b"x" * 40)
    (event,) = proto.events_received()
    assert isinstance(event, FrameError) and event.fatal
    proto.receive_data(b'"}\n{"b":1}\n')
    assert proto.events_received() == []
    assert proto.broken


def test_trailing_unterminated_frame_is_parsed_at_eof() -> None:
    proto = LineProtocol()
    proto.receive_data(b'{"a":1}')
    assert proto.events_received() == []
    proto.receive_eof()
    assert proto.events_received() == [{"a": 1}]
    assert proto.eof


def test_sent_frames_are_single_compact_json_lines() -> None:
    proto = LineProtocol()
    proto.send(request_frame(7, "tasks.list"))
    proto.send(error_frame(7, ErrorCode.METHOD_NOT_FOUND, "nope\nreally"))
    data = proto.data_to_send()
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert json.loads(lines[0]) == {"jsonrpc": "2.0", "id": 7, "method": "tasks.list", "params": {}}
    assert json.loads(lines[1])["error"]["code"] == -32601
    assert proto.data_to_send() == b""


def test_bytes_after_the_last_frame_are_handed_to_a_tunnel() -> None:
    proto = LineProtocol()
    proto.receive_data(b'{"method":"tunnel.open"}\nraw bytes')
    assert proto.events_received() == [{"method": "tunnel.open"}]
    assert proto.take_buffered() == b"raw bytes"


@pytest.mark.parametrize(
    ("code", "kind"),
    [(-32001, UnauthorizedError), (-32000, RemoteTaskError), (-32602, ProtocolError)],
)
def test_error_frames_map_to_the_exception_tree(code: int, kind: type[ProtocolError]) -> None:
    exc = error_from_frame({"code": code, "message": "m"})
    assert type(exc) is kind and exc.code == code and exc.message == "m"


def test_a_frame_limit_keeps_later_lines_raw_until_lifted() -> None:
    proto = LineProtocol(frame_limit=1)
    proto.receive_data(b'{"method":"tunnel.open"}\nSSH-2.0-banner\r\n{"id":2}\n')
    assert proto.events_received() == [{"method": "tunnel.open"}]
    assert proto.take_buffered() == b'SSH-2.0-banner\r\n{"id":2}\n'

    control = LineProtocol(frame_limit=1)
    control.receive_data(b'{"id":1}\n{"id":2}\n')
    assert control.events_received() == [{"id": 1}]
    control.lift_frame_limit()
    assert control.events_received() == [{"id": 2}]
