"""Frame-level fuzzing of a real control-channel server over loopback sockets.

Hypothesis sends batches of lines (valid frames, wrong types in every field of every method,
random bytes, truncated lines, oversized lines, deep nesting, non-JSON number literals, lone
surrogates, odd or missing ids) over up to four interleaved connections, and checks that every
reply is valid JSON-RPC 2.0 echoing its request id, that frames without an id get no reply, that
the server never crashes a connection handler and that no task is leaked afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzz_strategies import any_line, batches
from fuzz_support import STATS, ServerThread, SyncConn, run_batch
from hypothesis import HealthCheck, given, settings

FUZZ_SETTINGS = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerThread]:
    with ServerThread(park_ttl_s=0.3) as server:
        yield server
        # After every connection closed and the park TTL passed, nothing may remain.
        assert server.wait_until(lambda: not server.session_states(), 5.0), server.session_states()
        assert server.live["bodies"] == 0
        server.assert_healthy()


def test_random_batches_over_interleaved_connections_get_valid_replies(fuzz_server: ServerThread) -> None:
    control = SyncConn(fuzz_server.port)
    assert "result" in control.call("hello", {})
    frames_before = STATS.frames

    @FUZZ_SETTINGS
    @given(batch=batches)
    def one(batch: list[tuple[int, bytes]]) -> None:
        run_batch(fuzz_server.port, batch)
        assert "result" in control.call("tasks.list", timeout=1.0)  # a healthy session stays healthy
        fuzz_server.assert_healthy()

    one()
    control.call("bye")
    control.close()
    print(f"frame fuzz: {STATS.summary()}")
    assert STATS.frames - frames_before >= 1000


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(line=any_line)
def test_a_single_line_on_a_fresh_connection_is_answered_as_promised(fuzz_server: ServerThread, line: bytes) -> None:
    run_batch(fuzz_server.port, [(0, line)])
    fuzz_server.assert_healthy()
