"""The background beat of long steps (``RolloutActivities.beating``), in temporalio's own
activity environment: a step shorter than the beat interval sends no heartbeat (each one is a
write of the workflow's state on the server), a longer one beats every interval, and a step that
begins running late (an eagerly dispatched step counts as started on the server before a busy
worker runs it) beats at once, since its heartbeat timeout has been running since then."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import datetime, timedelta, timezone

from temporalio.testing import ActivityEnvironment

from durable_rollouts.activities.rollout import RolloutActivities

BEAT_S = 0.3


def _env(started_ago_s: float, beats: list[float], *, local: bool = False) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(), is_local=local,
        started_time=datetime.now(timezone.utc) - timedelta(seconds=started_ago_s))
    t0 = time.monotonic()
    env.on_heartbeat = lambda *details: beats.append(round(time.monotonic() - t0, 2))
    return env


async def _step(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


async def _beats(seconds: float, started_ago_s: float, *, local: bool = False) -> list[float]:
    beats: list[float] = []
    acts = RolloutActivities(beat_s=BEAT_S)
    assert await _env(started_ago_s, beats, local=local).run(acts.beating, _step(seconds)) == "done"
    return beats


async def test_a_step_shorter_than_the_beat_interval_sends_no_heartbeat() -> None:
    assert await _beats(0.1, started_ago_s=0.0) == []


async def test_a_longer_step_beats_every_interval_the_first_after_one_interval() -> None:
    beats = await _beats(BEAT_S * 3.5, started_ago_s=0.0)
    assert len(beats) in (2, 3), beats  # 3, or 2 when a busy loop drifts past the last one
    gaps = [later - earlier for earlier, later in zip([0.0, *beats], beats)]
    assert all(gap >= BEAT_S * 0.9 for gap in gaps), beats


async def test_a_step_that_begins_late_beats_at_once() -> None:
    beats = await _beats(0.1, started_ago_s=BEAT_S * 3)
    assert len(beats) == 1 and beats[0] < BEAT_S / 2, beats


async def test_a_local_step_never_heartbeats() -> None:
    assert await _beats(BEAT_S * 2.5, started_ago_s=BEAT_S * 3, local=True) == []
