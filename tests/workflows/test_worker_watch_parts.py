"""The worker watch's pure parts: the beat's encoding and how agent steps enter it.

``RunningAgents.flush`` is exercised with a plain coroutine as the sentinel's send (the real one
is an RPC to the server, covered end to end in ``tests/temporal/test_worker_watch.py``).
"""

from __future__ import annotations

import asyncio

from durable_rollouts.activities.watch import RunningAgents
from durable_rollouts.workflows.worker_watch import decode_running, encode_running


def test_a_beat_round_trips_and_5000_agent_steps_fit_a_small_heartbeat() -> None:
    running = [(f"job-{'ab12' * 8}-echo-{i:08x}-0", i % 3 + 1) for i in range(5000)]
    encoded = encode_running(running)
    assert sorted(decode_running(encoded)) == sorted(running)
    assert len(encoded) < 200_000  # uncompressed JSON is ~300 KB
    assert decode_running("") == [] and decode_running(encode_running([])) == []


async def test_an_agent_step_starts_only_once_a_beat_listing_it_landed() -> None:
    running, beats = RunningAgents(), []
    release = asyncio.Event()

    async def send(details: str) -> None:
        await release.wait()
        beats.append(decode_running(details))

    running.attach(send)

    async def agent(wid: str) -> None:
        async with running.running(wid, 1):
            assert any((wid, 1) in beat for beat in beats)  # listed before it runs
            await asyncio.sleep(0)

    tasks = [asyncio.ensure_future(agent(f"wf-{i}")) for i in range(50)]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in tasks) and beats == []  # all wait for the beat in flight
    release.set()
    await asyncio.gather(*tasks)
    assert 1 <= len(beats) <= 2  # one beat in flight, then one for everyone who queued behind it
    assert len(running) == 0  # each left when its agent ended


async def test_without_a_sentinel_or_with_a_failing_one_agent_steps_are_not_held() -> None:
    running = RunningAgents()
    async with running.running("wf", 1):  # no sentinel attached (the watch off): no wait
        assert len(running) == 1

    async def broken(details: str) -> None:
        raise ConnectionError("server away")

    running.attach(broken)
    async with running.running("wf", 2):  # a beat that does not land: logged, the agent goes on
        assert len(running) == 1
    assert await running.flush(force=True) is False
