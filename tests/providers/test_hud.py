"""HUDRuntime against a local stand-in for HUD's runtime gateway.

HUD's platform is unreachable here, so ``fake_hud.HUDStandIn`` replaces it: one aiohttp server on
127.0.0.1 with the session API HUDRuntime calls and the WebSocket tunnel endpoint, which starts
each session's env as a real env server process and bridges every WebSocket to a TCP connection
to it. Nothing on our side is replaced: the runtime's local listener, its ``websockets`` client
and the control channel of each rollout are the real ones. What the stand-in cannot show is HUD's
own side (its env deployment, its wire details beyond these calls).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hud import API_KEY, HUDStandIn
from substrates_support import REPO

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import ConfigError, ProviderError
from durable_rollouts.models import RuntimeConfig
from durable_rollouts.runtimes import hud as hud_module
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.runtimes.hud import HUDRuntime, session_trace_id
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.step_io import (
    ConnectInput,
    GradeInput,
    ProvisionInput,
    StartInput,
    TeardownInput,
)
from durable_rollouts.steps import substrate as steps

LETTERS = REPO / "examples" / "letters" / "env.py"
ENV = load_environment(str(LETTERS))


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HUDStandIn]:
    standin = HUDStandIn({"letters": LETTERS}, tmp_path).start()
    monkeypatch.setenv("HUD_API_KEY", API_KEY)
    monkeypatch.setenv("HUD_RUNTIME_URL", standin.url)
    yield standin
    hud_module._TUNNELS.clear()  # each test releases what it acquired; their loop is gone now
    standin.stop()


def _task(**args: object):  # type: ignore[no-untyped-def]
    return ENV.templates["count_letter"](**args)


def _key() -> str:
    return f"hud-{uuid.uuid4().hex[:8]}"


async def test_acquire_opens_a_session_and_tunnels_the_control_channel(gateway):
    runtime = HUDRuntime()
    key = _key()
    endpoint = await runtime.acquire(_task(), key)
    try:
        trace_id = session_trace_id(key)
        assert gateway.calls[:2] == [
            ("GET", f"/runtime/sessions?trace_id={trace_id}", None),  # none made yet
            ("POST", "/runtime/sessions", {"environment": "letters", "trace_id": trace_id})]
        [hosted] = gateway.sessions.values()
        assert endpoint.handle == {"session_id": hosted.id, "runtime_url": gateway.url}
        assert endpoint.url.startswith("tcp://127.0.0.1:")
        assert int(endpoint.url.rsplit(":", 1)[1]) != hosted.port  # our listener, not the env
        assert API_KEY not in json.dumps(endpoint.model_dump())  # not in workflow history
        opened = gateway.tunnels_opened
        async with await connect(endpoint.url) as client:
            prompt = await client.start_task("count_letter", {"word": "banana", "letter": "a"})
            assert "banana" in json.dumps(prompt)
            assert (await client.grade("3"))["score"] == 1.0
        assert gateway.tunnels_opened == opened + 1  # one WebSocket per TCP connection
    finally:
        await runtime.release(endpoint)
    assert not gateway.sessions and gateway.stopped[-1].proc.poll() is not None
    assert key not in hud_module._TUNNELS
    await runtime.release(endpoint)  # idempotent: the gateway's 404 is fine
    assert [c[:2] for c in gateway.calls[-2:]] == [("DELETE", f"/runtime/sessions/{hosted.id}")] * 2


async def test_a_retried_acquire_in_this_process_reuses_the_session(gateway):
    runtime, key = HUDRuntime(), _key()
    first = await runtime.acquire(_task(), key)
    try:
        second = await provider_from_spec(runtime.spec()).acquire(_task(), key)
        assert second.url == first.url and second.handle == first.handle
        assert len(gateway.sessions) == 1
    finally:
        await runtime.release(first)


async def test_an_acquire_in_another_process_adopts_the_session_its_key_made(gateway):
    """A new process (no listener of the key) finds the key's session by its trace id and
    tunnels to it; a second session of the key (an older leak) is deleted."""
    runtime, key = HUDRuntime(), _key()
    first = await runtime.acquire(_task(), key)
    hud_module._TUNNELS.pop(key).close()  # as in a new worker process
    await runtime._create_session(gateway.url, API_KEY, "letters", session_trace_id(key))
    second = await runtime.acquire(_task(), key)
    try:
        assert second.handle == first.handle and list(gateway.sessions) == [first.handle["session_id"]]
        assert len(gateway.stopped) == 1  # the extra one
        async with await connect(second.url) as client:
            await client.start_task("count_letter", {"word": "banana", "letter": "a"})
            assert (await client.grade("3"))["score"] == 1.0
    finally:
        await runtime.release(second)


async def test_a_gateway_without_the_listing_gets_a_new_session(gateway):
    gateway.listing = False  # answers the listing 405
    runtime, key = HUDRuntime(), _key()
    first = await runtime.acquire(_task(), key)
    hud_module._TUNNELS.pop(key).close()
    second = await runtime.acquire(_task(), key)
    assert second.handle != first.handle and len(gateway.sessions) == 2
    listings = [c for c in gateway.calls if c[0] == "GET" and c[1].startswith("/runtime/sessions")]
    assert len(listings) == 1  # a gateway without the listing is not asked again
    await runtime.release(first)
    await runtime.release(second)


async def test_the_durable_steps_run_a_rollout_through_the_tunnel(gateway):
    """provision -> connect -> start -> grade -> teardown, each from the recorded data only."""
    task, key = _task(word="strawberry", letter="r"), _key()
    endpoint = await steps.provision(ProvisionInput(key=key, task=task,
                                                    provider=HUDRuntime().spec()))
    endpoint = type(endpoint).model_validate_json(endpoint.model_dump_json())  # as in history
    session = await steps.connect(ConnectInput(endpoint=endpoint))
    await steps.start(StartInput(endpoint=endpoint, session=session, task=task))
    grade = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="3"))
    assert grade.reward == 1.0
    await steps.teardown(TeardownInput(endpoint=endpoint, session=session))
    assert not gateway.sessions and not hud_module._TUNNELS


async def test_a_batch_of_rollouts_runs_through_the_direct_executor(gateway):
    tasks = [_task(word=w, letter="a") for w in ("banana", "papaya", "cat")]
    job = await run_direct(Taskset("hud-batch", tasks), FixedAgent(answer="3"), HUDRuntime(),
                           group=2, max_concurrent=6)
    assert [r.error for r in job.runs] == [None] * 6
    assert sorted(r.reward for r in job.runs) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert len(gateway.stopped) == 6 and not gateway.sessions and not hud_module._TUNNELS


async def test_a_per_task_runtime_config_is_rejected_before_any_session(gateway):
    task = _task().model_copy(update={"runtime_config": RuntimeConfig(resources={"cpu": 2})})
    with pytest.raises(ConfigError, match="HUDRuntime cannot honour runtime_config"):
        await HUDRuntime().acquire(task, _key())
    assert not gateway.calls


async def test_gateway_refusals_are_one_clear_error(gateway, monkeypatch):
    with pytest.raises(ConfigError, match="404"):  # an environment the platform does not know
        await HUDRuntime(environment="nope").acquire(_task(), _key())
    monkeypatch.setenv("HUD_API_KEY", "wrong")
    with pytest.raises(ConfigError, match="refused \\$HUD_API_KEY"):
        await HUDRuntime().acquire(_task(), _key())
    monkeypatch.delenv("HUD_API_KEY")
    with pytest.raises(ConfigError, match="needs the HUD API key"):
        await HUDRuntime().acquire(_task(), _key())
    with pytest.raises(ProviderError, match="cannot reach"):
        monkeypatch.setenv("HUD_API_KEY", API_KEY)
        await HUDRuntime(runtime_url="http://127.0.0.1:9").acquire(_task(), _key())
    assert not gateway.sessions


async def test_a_refused_tunnel_fails_the_acquire_fast_and_deletes_the_session(gateway):
    """The session is granted, but the gateway refuses its WebSocket: no 300 s wait."""
    gateway.refuse_tunnels = True
    with pytest.raises(ProviderError, match="refused the tunnel"):
        await HUDRuntime(ready_timeout=30).acquire(_task(), _key())
    assert not gateway.sessions and len(gateway.stopped) == 1 and not hud_module._TUNNELS


async def test_a_missing_websockets_package_is_a_config_error(gateway, monkeypatch):
    monkeypatch.setitem(sys.modules, "websockets", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"durable-rollouts\[hud\]"):
        await HUDRuntime().acquire(_task(), _key())
    assert not gateway.calls


def test_spec_round_trips_carries_no_key_and_the_cli_names_it(monkeypatch):
    from durable_rollouts.cli.specs import parse_runtime

    monkeypatch.setenv("HUD_API_KEY", "secret-key")
    runtime = HUDRuntime(environment="letters", runtime_url="https://gw.example/base",
                         ready_timeout=42)
    assert "secret-key" not in runtime.spec().model_dump_json()
    rebuilt = provider_from_spec(runtime.spec())
    assert isinstance(rebuilt, HUDRuntime) and rebuilt.spec() == runtime.spec()
    assert rebuilt.locality == "process"
    assert hud_module._ws_base("https://gw.example/base") == "wss://gw.example/base"
    cli = parse_runtime("hud:letters")
    assert isinstance(cli, HUDRuntime) and cli.environment == "letters"
    assert parse_runtime("hud").environment is None
    with pytest.raises(ConfigError, match="expected http"):
        HUDRuntime(runtime_url="ftp://x")


async def test_a_durable_rollout_on_hud_records_the_card_steps(gateway, tmp_path):
    from durable_shape import CARD, durable_shapes

    job, shapes = await durable_shapes(HUDRuntime(), [_task(word="banana", letter="a")],
                                       FixedAgent(answer="3"), tmp_path)
    assert [r.reward for r in job.runs] == [1.0], [r.error for r in job.runs]
    assert shapes == [CARD]
