"""A trainer reading a long, busy job does not die of a busy query.

Found by ``bench_stream.py --long`` on a loaded box: the server refused the stream's query with
RESOURCE_EXHAUSTED ("consistent query buffer is full") and the consumer process exited. The
query is asked again with backoff; a query that is wrong (not busy) still fails at once. The
server's refusal cannot be provoked on demand, so the handle here stands in for the client's
workflow handle and raises the server's own error type.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from durable_rollouts.temporal.live import LiveJob


class _Handle:
    def __init__(self, fails: int, status: RPCStatusCode) -> None:
        self.fails, self.status, self.calls = fails, status, 0

    async def query(self, *args: object, **kwargs: object) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            raise RPCError("consistent query buffer is full", self.status, b"")
        return "the view"


class _Job(LiveJob):
    handle: _Handle

    @property
    def _workflow(self) -> _Handle:  # type: ignore[override]
        return self.handle


def _job(handle: object) -> LiveJob:
    job = object.__new__(_Job)
    job.handle = handle
    return job


async def test_a_busy_stream_query_is_asked_again() -> None:
    handle = _Handle(3, RPCStatusCode.RESOURCE_EXHAUSTED)
    assert await _job(handle).view("trainer", 0, 8) == "the view"
    assert handle.calls == 4


async def test_a_wrong_stream_query_fails_at_once() -> None:
    handle = _Handle(3, RPCStatusCode.INVALID_ARGUMENT)
    with pytest.raises(RPCError):
        await _job(handle).view("trainer", 0, 8)
    assert handle.calls == 1


class _CancelledUpdate:
    """Stands in for the handle: temporalio turns a cancelled ``execute_update`` caller into
    ``WorkflowUpdateRPCTimeoutOrCancelledError`` (from the ``CancelledError``), as it does here."""

    async def execute_update(self, *args: object, **kwargs: object) -> None:
        try:
            raise asyncio.CancelledError()
        except asyncio.CancelledError as err:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from err


async def test_a_consumer_cancelled_mid_update_is_cancelled_not_failed() -> None:
    """SIGTERM while a consumer waits on the batch (``stream_wait``) cancels it; the CLI then
    exits 130, not with an error line (found by ``test_cli_stream``'s SIGTERM test, once)."""
    with pytest.raises(asyncio.CancelledError):
        await _job(_CancelledUpdate())._update("stream_wait", {"consumer": "trainer", "start": 0})  # type: ignore[arg-type]
