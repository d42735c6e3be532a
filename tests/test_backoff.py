"""The package's one backoff (``durable_rollouts.backoff``)."""

from __future__ import annotations

import itertools

import pytest

from durable_rollouts.backoff import delays, retry


def test_delays_double_up_to_their_cap() -> None:
    assert list(itertools.islice(delays(0.1, 0.5), 6)) == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert list(itertools.islice(delays(1.0), 4)) == [1.0, 2.0, 4.0, 8.0]


async def test_retry_stops_at_the_first_permanent_error_and_after_its_attempts() -> None:
    calls: list[str] = []

    async def flaky() -> str:
        calls.append("x")
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert await retry(flaky, attempts=3, first_delay_s=0.001, transient=lambda e: True) == "ok"
    calls.clear()
    with pytest.raises(ConnectionError):
        await retry(flaky, attempts=2, first_delay_s=0.001, transient=lambda e: True)
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(ConnectionError):
        await retry(flaky, attempts=5, first_delay_s=0.001, transient=lambda e: False)
    assert len(calls) == 1
