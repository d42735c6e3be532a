"""Hypothesis strategies for control-channel lines: valid, malformed, oversized, deeply nested.

Every strategy yields one line as bytes without its trailing newline (a newline inside would
split it into two frames). Shared by tests/fuzz and benchmarks/fuzz_long.py.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from fuzz_support import FUZZ_MAX_LINE, METHODS

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
"""Any JSON value (strings may hold lone surrogates: JSON can escape them)."""

ids = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.text(max_size=12),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
"""Request ids, JSON-RPC-valid ones (string, number, null) and invalid ones."""

_method_names = st.one_of(
    st.sampled_from(METHODS),
    st.sampled_from(["", "Hello", "tasks.", "tasks.delete", "rpc.discover", "bye "]),
    st.text(max_size=16),
    json_values,
)

_field_values: dict[str, dict[str, Any]] = {
    "hello": {"session_id": json_values, "token": json_values, "protocol": st.sampled_from(["1", "2"]) | json_values},
    "tasks.start": {
        "id": st.sampled_from(["echo", "typed", "boom", "nope"]) | json_values,
        "args": st.fixed_dictionaries(
            {}, optional={"word": json_values, "n": json_values, "items": json_values, "when": json_values}
        )
        | json_values,
    },
    "tasks.grade": {"answer": json_values, "extra": json_values},
    "tunnel.open": {"capability": st.sampled_from(["echo", "nope"]) | json_values, "token": json_values},
}


@st.composite
def _params(draw: st.DrawFn, method: Any) -> Any:
    """Params for ``method``: each known field present or not, right or wrong type, plus extras."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not an object at all (or null)
    fields = _field_values.get(method, {}) if isinstance(method, str) else {}
    params = {name: draw(strategy) for name, strategy in fields.items() if draw(st.booleans())}
    if draw(st.integers(0, 4)) == 0:
        params[draw(st.text(max_size=8))] = draw(json_values)
    return params


@st.composite
def frames(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object shaped like a request, with every member possibly absent, odd or wrong."""
    method = draw(_method_names)
    frame: dict[str, Any] = {}
    if draw(st.integers(0, 5)):
        frame["jsonrpc"] = "2.0" if draw(st.integers(0, 5)) else draw(json_values)
    if draw(st.integers(0, 3)):
        frame["id"] = draw(ids)
    if draw(st.integers(0, 9)):
        frame["method"] = method
    if draw(st.integers(0, 4)):
        frame["params"] = draw(_params(method))
    return frame


def _dump(frame: Any, ascii_only: bool) -> bytes:
    return json.dumps(frame, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@st.composite
def frame_lines(draw: st.DrawFn) -> bytes:
    return _dump(draw(frames()), draw(st.booleans()))


@st.composite
def truncated_lines(draw: st.DrawFn) -> bytes:
    line = draw(frame_lines())
    return line[: draw(st.integers(0, max(0, len(line) - 1)))]


@st.composite
def nested_lines(draw: st.DrawFn) -> bytes:
    """Deep nesting: around and beyond the JSON parser's recursion limit, in id, params or answer."""
    depth = draw(st.sampled_from([10, 200, 900, 990, 1000, 1010, 1500, 3000]))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    nested = opener * depth + b"1" + closer * depth
    where = draw(st.sampled_from(["bare", "id", "params", "answer", "args"]))
    if where == "bare":
        return nested
    if where == "id":
        return b'{"jsonrpc":"2.0","id":' + nested + b',"method":"tasks.list"}'
    if where == "params":
        return b'{"jsonrpc":"2.0","id":7,"method":"hello","params":' + nested + b"}"
    if where == "answer":
        return b'{"jsonrpc":"2.0","id":8,"method":"tasks.grade","params":{"answer":' + nested + b"}}"
    return b'{"jsonrpc":"2.0","id":9,"method":"tasks.start","params":{"id":"typed","args":{"n":1,"items":' + nested + b"}}}"


@st.composite
def odd_literal_lines(draw: st.DrawFn) -> bytes:
    """Lines Python's json accepts but JSON does not, and strings JSON allows but UTF-8 cannot carry."""
    value = draw(
        st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999", b'"\\ud800"', b'"\\udfff x"', b"1" * 4400])
    )
    where = draw(st.sampled_from(["id", "method", "answer", "session_id", "bare"]))
    if where == "bare":
        return value
    if where == "id":
        return b'{"jsonrpc":"2.0","id":' + value + b',"method":"tasks.list"}'
    if where == "method":
        return b'{"jsonrpc":"2.0","id":1,"method":' + value + b"}"
    if where == "answer":
        return b'{"jsonrpc":"2.0","id":2,"method":"tasks.grade","params":{"answer":' + value + b"}}"
    return b'{"jsonrpc":"2.0","id":3,"method":"hello","params":{"session_id":' + value + b"}}"


@st.composite
def huge_lines(draw: st.DrawFn) -> bytes:
    """Lines just under, at and over the test server's frame limit."""
    size = draw(st.sampled_from([FUZZ_MAX_LINE - 1, FUZZ_MAX_LINE, FUZZ_MAX_LINE + 1, FUZZ_MAX_LINE * 3, 60_000]))
    head = b'{"jsonrpc":"2.0","id":1,"method":"tasks.grade","params":{"answer":"'
    tail = b'"}}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


raw_lines = st.binary(max_size=64).map(lambda b: b.replace(b"\n", b""))
valid_session_lines = st.sampled_from(
    [
        b'{"jsonrpc":"2.0","id":100,"method":"hello","params":{}}',
        b'{"jsonrpc":"2.0","id":101,"method":"tasks.start","params":{"id":"echo","args":{"word":"w"}}}',
        b'{"jsonrpc":"2.0","id":102,"method":"tasks.grade","params":{"answer":"w"}}',
        b'{"jsonrpc":"2.0","id":103,"method":"tasks.cancel"}',
        b'{"jsonrpc":"2.0","id":104,"method":"tasks.list"}',
        b'{"jsonrpc":"2.0","method":"tasks.list"}',
        b'{"jsonrpc":"2.0","id":105,"method":"bye"}',
        b"",
        b"   ",
    ]
)

any_line = st.one_of(
    frame_lines(),
    frame_lines(),
    valid_session_lines,
    truncated_lines(),
    raw_lines,
    nested_lines(),
    odd_literal_lines(),
    huge_lines(),
)
"""One line of any kind, biased towards structured frames."""

batches = st.lists(st.tuples(st.integers(0, 3), any_line), min_size=1, max_size=12)
"""Lines spread over up to four interleaved connections."""
