"""Counting a stream's queries: how many ``LiveJob.view`` calls a consumer made (the tests that
show reading ahead and waking cost few queries)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_rollouts.temporal.live import LiveJob


def count_views(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count ``LiveJob.view`` calls from now on; returns how many so far, when called."""
    views = 0
    real_view = LiveJob.view

    async def counted(self, consumer: str, start: int, limit: int):  # type: ignore[no-untyped-def]
        nonlocal views
        views += 1
        return await real_view(self, consumer, start, limit)

    monkeypatch.setattr(LiveJob, "view", counted)
    return lambda: views
