"""Sessions are bound to the token that created them: with several server tokens (one per
tenant), a connection authenticated with another token can neither resume nor adopt (grade)
a parked session, nor learn that it exists."""

from __future__ import annotations

import asyncio

from security_helpers import Raw, make_env

from durable_rollouts.envserver import serving
from durable_rollouts.envserver.sessions import SessionState

ALICE, BOB = "token-alice", "token-bob"


async def _park_a_task(port: int, token: str, word: str) -> str:
    conn = await Raw.open(port)
    session_id = (await conn.call("hello", {"token": token}))["result"]["session_id"]
    assert (await conn.call("tasks.start", {"id": "secret", "args": {"word": word}}))["result"]
    await conn.close()
    return session_id


async def _wait_parked(server, session_id: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(200):
        session = server.sessions.get(session_id)
        if session is not None and session.state is SessionState.PARKED:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{session_id} never parked")


async def test_another_tokens_connection_cannot_resume_a_parked_session() -> None:
    async with serving(make_env(), token=[ALICE, BOB]) as server:
        alice_session = await _park_a_task(server.port, ALICE, "hidden-word")
        await _wait_parked(server, alice_session)

        bob = await Raw.open(server.port)
        reply = await bob.call("hello", {"token": BOB, "session_id": alice_session})
        assert reply["error"]["code"] == -32600
        assert "unknown session" in reply["error"]["message"]  # same answer as a made-up id
        await bob.close()
        assert server.sessions.get(alice_session).state is SessionState.PARKED  # type: ignore[union-attr]

        alice = await Raw.open(server.port)
        assert (await alice.call("hello", {"token": ALICE, "session_id": alice_session}))["result"]
        assert (await alice.call("tasks.grade", {"answer": "hidden-word"}))["result"] == {"score": 1.0}
        await alice.close()


async def test_another_tokens_connection_cannot_adopt_a_parked_task_by_grading() -> None:
    async with serving(make_env(), token=[ALICE, BOB]) as server:
        alice_session = await _park_a_task(server.port, ALICE, "w1")
        await _wait_parked(server, alice_session)

        bob = await Raw.open(server.port)
        assert (await bob.call("hello", {"token": BOB}))["result"]
        reply = await bob.call("tasks.grade", {"answer": "w1"})
        assert reply["error"]["code"] == -32600 and "no task in progress" in reply["error"]["message"]
        await bob.close()
        assert server.grade_count == 0

        alice = await Raw.open(server.port)
        assert (await alice.call("hello", {"token": ALICE}))["result"]
        assert (await alice.call("tasks.grade", {"answer": "w1"}))["result"] == {"score": 1.0}
        await alice.close()
        assert server.grade_count == 1


async def test_adoption_only_counts_the_callers_own_parked_tasks() -> None:
    async with serving(make_env(), token=[ALICE, BOB]) as server:
        sessions = [await _park_a_task(server.port, ALICE, "a"), await _park_a_task(server.port, BOB, "b")]
        for session_id in sessions:
            await _wait_parked(server, session_id)
        # Two parked tasks in total, but only one is Bob's: he adopts his own, never Alice's.
        bob = await Raw.open(server.port)
        assert (await bob.call("hello", {"token": BOB}))["result"]
        assert (await bob.call("tasks.grade", {"answer": "b"}))["result"] == {"score": 1.0}
        assert (await bob.call("hello", {}))["result"]["session_id"] == sessions[1]
        await bob.close()
        assert server.sessions.get(sessions[0]).runner.graded is False  # type: ignore[union-attr]


async def test_with_a_single_token_every_authenticated_connection_may_resume() -> None:
    async with serving(make_env(), token=ALICE) as server:
        session_id = await _park_a_task(server.port, ALICE, "x")
        await _wait_parked(server, session_id)
        conn = await Raw.open(server.port)
        assert (await conn.call("hello", {"token": ALICE, "session_id": session_id}))["result"]
        await conn.close()
