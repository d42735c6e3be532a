"""``tasks.start`` under a ``start_key``: a replayed start step gets the task it already started.

The crash this is for (a worker SIGKILLed after the start step, before its workflow task
completed) is in ``tests/temporal/test_survival.py``; here the wire, over real sockets, and the
client that uses it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import EnvServer
from durable_rollouts.models import Task
from durable_rollouts.protocol import FEATURE_START_KEY, RESUMED_SESSION
from durable_rollouts.runtimes import Runtime
from durable_rollouts.step_io import ConnectInput, VerifyInput
from durable_rollouts.steps import substrate as steps
from durable_rollouts.steps.verifier import open_verifier

START = {"id": "count", "args": {"word": "kiwi", "letter": "i"}, "start_key": "run-1/rollout-a"}


async def test_hello_names_the_feature(raw: Any) -> None:
    conn = await raw()
    assert FEATURE_START_KEY in (await conn.result("hello", {}))["features"]


async def test_a_repeated_start_moves_into_the_first_session_and_runs_setup_once(
        raw: Any, server: EnvServer, env_log: list[str]) -> None:
    first = await raw()
    sid = (await first.result("hello", {}))["session_id"]
    assert await first.result("tasks.start", START) == {"prompt": "count i in kiwi"}
    await first.close()  # the worker died before its start was recorded: the session parks
    await asyncio.sleep(0.05)
    second = await raw()
    own = (await second.result("hello", {}))["session_id"]  # the replayed connect's new session
    again = await second.result("tasks.start", START)
    assert again == {"prompt": "count i in kiwi", RESUMED_SESSION: sid}
    assert (await second.result("hello", {}))["session_id"] == sid  # the connection is in it now
    assert own not in server.sessions  # the connect step's session, never used, is closed
    assert await second.result("tasks.grade", {"answer": "2"}) == {"score": 1.0}
    assert env_log == ["start:kiwi", "grade:2", "teardown:kiwi"]


async def test_a_start_retried_on_its_own_session_returns_its_prompt_without_a_second_setup(
        raw: Any, env_log: list[str]) -> None:
    conn = await raw()
    await conn.result("hello", {})
    assert await conn.result("tasks.start", START) == await conn.result("tasks.start", START)
    assert env_log == ["start:kiwi"]


async def test_other_keys_no_key_and_a_session_live_elsewhere_start_the_task(
        raw: Any, env_log: list[str]) -> None:
    holder = await raw()
    await holder.result("hello", {})
    await holder.result("tasks.start", START)
    other = await raw()
    await other.result("hello", {})
    # the key's session is live on another connection (a hung worker): a task of its own
    assert RESUMED_SESSION not in await other.result("tasks.start", START)
    await other.result("tasks.start", {**START, "start_key": "run-2/rollout-a"})
    await other.result("tasks.start", {"id": "count", "args": {"word": "kiwi", "letter": "i"}})
    assert env_log.count("start:kiwi") == 4


async def test_a_bad_key_is_a_32602_error(raw: Any) -> None:
    conn = await raw()
    assert await conn.error_code("tasks.start", {**START, "start_key": ""}) == -32602
    assert await conn.error_code("tasks.start", {**START, "start_key": "k" * 513}) == -32602


async def test_the_client_follows_the_move_and_grades_in_the_first_session(
        server: EnvServer, env_log: list[str]) -> None:
    first = await connect(server.url, ready_timeout=10)
    sid = first.session_id
    await first.start_task("count", {"word": "kiwi", "letter": "i"}, start_key="k1")
    await first.close()  # not bye: the session parks
    await asyncio.sleep(0.05)
    second = await connect(server.url, ready_timeout=10)
    frame = await second.start_task("count", {"word": "kiwi", "letter": "i"}, start_key="k1")
    assert frame == {"prompt": "count i in kiwi"}  # the member naming the session is taken out
    assert second.session_id == sid and second.manifest is not None and second.manifest.session_id == sid
    assert (await second.grade("2"))["score"] == 1.0
    await second.close()
    assert env_log == ["start:kiwi", "grade:2", "teardown:kiwi"]


async def test_a_server_that_names_no_feature_never_gets_a_key(server: EnvServer, env_log: list[str]) -> None:
    client = await connect(server.url, ready_timeout=10)
    client.features = frozenset()  # as an earlier release's server (its params forbid extras)
    await client.start_task("count", {"word": "kiwi", "letter": "i"}, start_key="k2")
    assert server.sessions.started_under("k2", None) is None
    await client.close()


async def test_a_verifier_opened_again_under_its_key_gets_its_first_session(
        server: EnvServer, env_log: list[str]) -> None:
    """``verify_open`` repeated after its result was lost (a worker died): the verifier's task,
    here on the actor's own server, is set up once and the same session is returned."""
    verifier = Task(env="testenv", id="count", args={"word": "fig", "letter": "f"})
    task = Task(env="testenv", id="count", verifier=verifier)
    endpoint = await Runtime(server.url).acquire(task, "vk")
    actor = await steps.connect(ConnectInput(endpoint=endpoint))
    inp = VerifyInput(task=task, actor_endpoint=endpoint, actor_session=actor, provider=Runtime(server.url).spec(),
                      key="vk")
    first = await open_verifier(inp, start_key="run-1/vk/verifier")
    again = await open_verifier(inp, start_key="run-1/vk/verifier")
    assert again.session.session_id == first.session.session_id
    assert env_log == ["start:fig"]
    other = await open_verifier(inp, start_key="run-2/vk/verifier")  # another run: its own
    assert other.session.session_id != first.session.session_id
    assert env_log == ["start:fig", "start:fig"]
