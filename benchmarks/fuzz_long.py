"""Long fuzz run of the control channel (the CI tests in tests/fuzz are the short version).

    python benchmarks/fuzz_long.py --frames 100000

Sends at least ``--frames`` frames to real servers on 127.0.0.1: hypothesis-generated batches
of lines over interleaved connections (the frame-level fuzzer of tests/fuzz/test_frame_fuzz.py)
and, every few rounds, runs of the protocol-state machine of tests/fuzz/test_protocol_states.py
against a token-less and a token server. After every batch a control session must answer within
1 s. At the end every server must hold no session and no running task once the park TTL has
passed, and no connection handler may have crashed. Prints the totals; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from _common import with_test_helpers

with_test_helpers("fuzz")

from fuzz_strategies import batches
from fuzz_support import STATS, ServerThread, SyncConn, run_batch
from hypothesis import HealthCheck, Phase, given, settings
from test_protocol_states import TOKEN, make_machine

_gc_pauses: list[float] = []
_gc_started: list[float] = [0.0]


def _time_full_collections(phase: str, info: dict[str, Any]) -> None:
    """The server runs in a thread of this process, so a long GC pause shows up as reply latency."""
    if info["generation"] == 2:
        if phase == "start":
            _gc_started[0] = time.monotonic()
        else:
            _gc_pauses.append(time.monotonic() - _gc_started[0])


QUICK = settings(phases=[Phase.generate], database=None, deadline=None, suppress_health_check=list(HealthCheck))


def _frame_round(server: ServerThread, control: SyncConn, examples: int) -> None:
    @settings(QUICK, max_examples=examples)
    @given(batch=batches)
    def fuzz(batch: list[tuple[int, bytes]]) -> None:
        run_batch(server.port, batch)
        assert "result" in control.call("tasks.list", timeout=1.0), "control session stopped answering"
        server.assert_healthy()

    fuzz()


def _state_round(server: ServerThread, control: SyncConn, token: str | None, examples: int) -> None:
    machine = make_machine(server, control, token)
    machine.TestCase.settings = settings(QUICK, max_examples=examples, stateful_step_count=40)
    machine.TestCase().runTest()


def _drain(server: ServerThread, control: SyncConn) -> None:
    control.call("bye")
    control.close()
    assert server.wait_until(lambda: not server.session_states(), server.park_ttl_s + 5), server.session_states()
    assert server.runner_count() == 0 and server.live["bodies"] == 0, "a task leaked"
    server.assert_healthy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="send at least this many frames")
    parser.add_argument("--state-every", type=int, default=4, help="run the state machine every N rounds (0: never)")
    args = parser.parse_args(argv)

    gc.callbacks.append(_time_full_collections)
    started = time.monotonic()
    with ServerThread(park_ttl_s=0.5) as frames_server, ServerThread() as plain, ServerThread(token=TOKEN) as tokened:
        controls = {}
        for name, server, token in (("frames", frames_server, None), ("plain", plain, None), ("token", tokened, TOKEN)):
            controls[name] = SyncConn(server.port)
            assert "result" in controls[name].call("hello", {"token": token} if token else {})
        rounds = 0
        try:
            while STATS.frames < args.frames:
                _frame_round(frames_server, controls["frames"], 200)
                rounds += 1
                if args.state_every and rounds % args.state_every == 0:
                    _state_round(plain, controls["plain"], None, 10)
                    _state_round(tokened, controls["token"], TOKEN, 10)
                elapsed = time.monotonic() - started
                print(f"[{elapsed:6.1f} s] {STATS.frames} frames", file=sys.stderr, flush=True)
            for name, server in (("frames", frames_server), ("plain", plain), ("token", tokened)):
                _drain(server, controls[name])
        except Exception as exc:
            print(f"FAILED after {STATS.frames} frames: {type(exc).__name__}: {exc}", flush=True)
            return 1
    elapsed = time.monotonic() - started
    print(f"fuzz_long OK in {elapsed:.1f} s ({STATS.frames / elapsed:.0f} frames/s, {rounds} rounds)")
    print(STATS.summary())
    longest = max(_gc_pauses, default=0.0) * 1000
    print(f"full GC pauses of this process (server thread included): {len(_gc_pauses)}, longest {longest:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
