"""Wire compatibility with HUD v6, both ways, against the real ``hud`` package.

HUD's client (``hud.clients.connect``, HUD's own ``Taskset.run``) drives our env server; our
client and our rollout steps drive hud's own server (``python -m hud.environment.server``, what
``hud serve`` runs). Both sides list the same tasks for the same templates.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

hud = pytest.importorskip("hud", reason="needs the hud package (HUD v6): pip install 'durable-rollouts[hud]'")

from hud.agents.base import Agent as HudAgentBase  # noqa: E402
from hud.capabilities import Connection  # noqa: E402
from hud.clients import HudProtocolError  # noqa: E402
from hud.environment.egress import WorkspaceRoute  # noqa: E402
from hud_paths import QUICKSTART  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from durable_rollouts import Environment  # noqa: E402
from durable_rollouts.client.envclient import connect  # noqa: E402
from durable_rollouts.envserver import serving  # noqa: E402
from durable_rollouts.errors import ConfigError  # noqa: E402
from durable_rollouts.models import Task  # noqa: E402
from durable_rollouts.runtimes import Runtime  # noqa: E402
from durable_rollouts.step_io import ConnectInput, GradeInput, StartInput, TeardownInput  # noqa: E402
from durable_rollouts.steps import substrate as steps  # noqa: E402

LETTERS = Path(__file__).resolve().parents[2] / "examples" / "letters" / "env.py"


def _letters() -> Any:
    from durable_rollouts.envserver import load_environment

    return load_environment(str(LETTERS))


class _Counted(HudAgentBase):
    async def __call__(self, run: Any) -> None:
        run.trace.content = "3"


async def test_huds_client_with_workspace_routes_and_connections_drives_our_server() -> None:
    routes = [WorkspaceRoute(capability="shell", host="api.example.test", port=443)]
    connections = [Connection(name="model", capability="shell", url="https://api.example.test/v1",
                              headers={"authorization": "Bearer x"})]
    async with serving(_letters()) as server:
        async with hud.connect(hud.Runtime(server.url), workspace_routes=routes,
                               connections=connections) as client:
            assert client.manifest.session_id.startswith("sess-")
            assert client.manifest.server_info.name == "letters"
            assert {t["id"] for t in await client.list_tasks()} >= {"count_letter"}
            started = await client.start_task("count_letter", {"word": "strawberry", "letter": "r"})
            assert "strawberry" in started["prompt"]
            assert (await client.grade({"answer": "3"}))["score"] == 1.0
            # HUD's heartbeat: hello again with its own session id and the same params
            again = await client._call("hello", {"session_id": client.manifest.session_id,
                                                 "workspace_routes": [r.to_wire() for r in routes]})
            assert again["session_id"] == client.manifest.session_id


async def test_huds_own_taskset_run_grades_against_our_server() -> None:
    async with serving(_letters()) as server:
        rows = [hud.Task(env="letters", id="count_letter", args={"word": w}) for w in ("strawberry", "banana")]
        job = await hud.Taskset("letters", rows).run(_Counted(), runtime=hud.Runtime(server.url))
    assert [run.reward for run in job.runs] == [1.0, 0.0]
    assert all(not run.grade.is_error for run in job.runs)


async def test_malformed_hud_hello_params_are_32602_and_the_protocol_is_negotiated() -> None:
    async with serving(_letters()) as server:
        host, port = server.url.removeprefix("tcp://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))

        async def call(params: dict[str, Any]) -> dict[str, Any]:
            writer.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "hello", "params": params}).encode() + b"\n")
            return json.loads(await reader.readline())

        try:
            assert (await call({"workspace_routes": "shell"}))["error"]["code"] == -32602
            assert (await call({"connections": {"a": 1}}))["error"]["code"] == -32602
            assert (await call({"protocol": ["9", "1"], "some_future_param": 1}))["result"]["protocol"] == "1"
            assert (await call({"protocol": "9"}))["error"]["code"] == -32600
            assert (await call({}))["result"]["protocol"] == "1"  # a HUD client names none
        finally:
            writer.close()


class _Out(BaseModel):
    count: int


def _templates(env: Any) -> None:
    @env.template(description="Count a letter.")
    async def count_letter(word: str = "strawberry", letter: str = "r"):
        yield f"How many {letter} in {word}?"

    @env.template(description="typed", input=_Out, returns=_Out)
    async def typed(n: int, tags: list[str] | None = None, mode: Literal["a", "b"] = "a", anything=3, **extra):
        yield "p"

    @env.template(id="bare-one")
    async def bare(x: float):
        yield "p"


async def test_tasks_list_equals_huds_for_the_same_templates() -> None:
    ours, theirs = Environment(name="same"), hud.Environment(name="same")
    _templates(ours)
    _templates(theirs)
    async with serving(ours) as a, serving(theirs) as b:  # theirs: hud's own server
        async with await connect(a.url) as ca, await connect(b.url) as cb:
            assert (ca.server, cb.server) == ("rollouts", "hud")
            ours_list, theirs_list = await ca.list_tasks(), await cb.list_tasks()
    assert ours_list == theirs_list
    typed = next(t for t in ours_list if t["id"] == "typed")
    assert typed["args"]["properties"]["n"]["title"] == "N" and "input" in typed and "returns" in typed


async def test_our_client_drives_huds_own_server(hud_served) -> None:
    with hud_served(QUICKSTART) as url:
        client = await connect(url)
        try:
            assert client.server == "hud" and client.env.name == "letter-count"
            prompt = await client.start_task("count_letter", {"word": "banana", "letter": "a"})
            assert "banana" in prompt["prompt"]
            assert (await client.grade("3"))["score"] == 1.0
        finally:
            await client.close()


async def test_the_card_steps_keep_one_session_per_rollout_on_huds_server(
        hud_served, tmp_path, monkeypatch) -> None:
    """connect (hello, close) -> start in a new session -> grade there -> a retried grade finds
    the graded session gone: on this host it returns the grade's receipt; on another (no
    receipt) it reports the grade lost; never grading twice -> teardown."""
    task = Task(env="letter-count", id="count_letter", args={"word": "strawberry"})
    with hud_served(QUICKSTART) as url:
        endpoint = await Runtime(url).acquire(task, "k1")
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        assert session.server == "hud"
        started = await steps.start(StartInput(endpoint=endpoint, session=session, task=task, with_session=True))
        assert started.session.session_id != session.session_id  # HUD dropped the task-less one
        assert "strawberry" in started.prompt["prompt"]
        graded = GradeInput(endpoint=endpoint, session=started.session, answer="3")
        grade = await steps.grade(graded)
        assert grade.reward == 1.0 and not grade.is_error
        assert await steps.grade(graded, retried=True) == grade  # the receipt this host kept
        monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path))  # another host: no receipt
        lost = await steps.grade(graded, retried=True)
        assert lost.is_error and "was lost" in lost.content and lost.reward == 0.0
        loop = asyncio.get_running_loop()
        began = loop.time()
        await steps.teardown(TeardownInput(endpoint=endpoint, session=started.session))
        assert loop.time() - began < 1.0  # a graded HUD session is not waited for


async def test_bad_arguments_on_huds_server_are_a_config_error(hud_served) -> None:
    task = Task(env="letter-count", id="count_letter", args={"wrd": "x"})
    with hud_served(QUICKSTART) as url:
        endpoint = await Runtime(url).acquire(task, "k2")
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        with pytest.raises(ConfigError, match="bad args"):
            await steps.start(StartInput(endpoint=endpoint, session=session, task=task, with_session=True))


async def test_huds_client_reads_our_replies_and_error_frames() -> None:
    """HUD's client reads our hello reply (extra ``protocol`` member) and our error frames."""
    async with serving(_letters()) as server:
        async with hud.connect(hud.Runtime(server.url)) as client:
            with pytest.raises(HudProtocolError) as info:
                await client.start_task("no_such_task", {})
            assert info.value.code == -32602
