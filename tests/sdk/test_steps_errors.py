"""The step functions classify failures at the edge: user mistakes, a lost substrate, results."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import (
    ConfigError,
    RemoteTaskError,
    ServerBusyError,
    SubstrateGoneError,
)
from durable_rollouts.models import (
    AgentInput,
    AgentSpec,
    ConnectInput,
    GradeInput,
    Session,
    StartInput,
    Task,
    TeardownInput,
)
from durable_rollouts.sdk import steps
from durable_rollouts.sdk.providers import LocalRuntime, Runtime

env = Environment(name="steps", version="0.1.0")


@env.template()
async def no_score():
    yield "answer anything"
    yield {"content": "I forgot the score"}


@env.template()
async def needs_int(n: int):
    yield f"n={n}"
    yield 1.0


@env.template()
async def broken_setup():
    raise RuntimeError("setup exploded")
    yield "never"  # an async generator that fails before its prompt


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_refused_endpoint_is_reported_as_substrate_gone() -> None:
    endpoint = await Runtime(f"tcp://127.0.0.1:{_free_port()}").acquire(Task(env="x", id="y"), "k")
    session = Session(session_id="gone", env_name="x", env_version="0")
    with pytest.raises(SubstrateGoneError):
        await steps.start(StartInput(endpoint=endpoint, session=session, task=Task(env="x", id="y")))
    with pytest.raises(SubstrateGoneError):
        await steps.connect(ConnectInput(endpoint=endpoint, ready_timeout_s=0.3))
    await steps.teardown(TeardownInput(endpoint=endpoint, session=session))  # never raises


async def test_unknown_session_is_reported_as_substrate_gone() -> None:
    async with serving(env) as server:
        endpoint = await Runtime(server.url).acquire(Task(env="steps", id="no_score"), "k")
        session = Session(session_id="not-a-session", env_name="steps", env_version="0.1.0")
        with pytest.raises(SubstrateGoneError, match="not-a-session"):
            await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="1"))


async def test_bad_task_and_bad_args_are_config_errors() -> None:
    async with serving(env) as server:
        endpoint = await Runtime(server.url).acquire(Task(env="steps", id="no_score"), "k")
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        with pytest.raises(ConfigError, match="nope"):
            await steps.start(StartInput(endpoint=endpoint, session=session, task=Task(env="steps", id="nope")))
        bad = Task(env="steps", id="needs_int", args={"n": "not a number"})
        with pytest.raises(ConfigError):
            await steps.start(StartInput(endpoint=endpoint, session=session, task=bad))
        await steps.teardown(TeardownInput(endpoint=endpoint, session=session))


async def test_refused_starts_keep_their_own_error_with_a_serialisable_cause_chain() -> None:
    """A start the env refuses for a reason other than bad arguments (busy, task raised) is
    re-raised as is: never as its own cause, which sent Temporal's failure converter into an
    endless recursion instead of reporting the failure."""
    async with serving(env, max_tasks=1) as server:
        endpoint = await Runtime(server.url).acquire(Task(env="steps", id="no_score"), "k")
        first = await steps.connect(ConnectInput(endpoint=endpoint))
        await steps.start(StartInput(endpoint=endpoint, session=first, task=Task(env="steps", id="no_score")))
        second = await steps.connect(ConnectInput(endpoint=endpoint))
        cases = [(second, Task(env="steps", id="no_score"), ServerBusyError),
                 (first, Task(env="steps", id="broken_setup"), RemoteTaskError)]
        for session, task, kind in cases:
            with pytest.raises(kind) as caught:
                await steps.start(StartInput(endpoint=endpoint, session=session, task=task))
            seen, err = set(), caught.value
            while err is not None:  # the chain ends: what Temporal walks to build the failure
                assert id(err) not in seen, f"{type(err).__name__} is its own cause"
                seen.add(id(err))
                err = err.__cause__
        await steps.teardown(TeardownInput(endpoint=endpoint, session=first))
        await steps.teardown(TeardownInput(endpoint=endpoint, session=second))


async def test_grade_frame_without_numeric_score_becomes_an_error_grade() -> None:
    async with serving(env) as server:
        endpoint = await Runtime(server.url).acquire(Task(env="steps", id="no_score"), "k")
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        await steps.start(StartInput(endpoint=endpoint, session=session, task=Task(env="steps", id="no_score")))
        grade = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="x"))
        assert grade.is_error and grade.reward == 0.0
        await steps.teardown(TeardownInput(endpoint=endpoint, session=session))


async def test_unimportable_agent_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "env.py"
    path.write_text(textwrap.dedent("""
        from durable_rollouts.envserver import Environment
        env = Environment(name="tiny")

        @env.template()
        async def t():
            yield "hi"
            yield 1.0
    """))
    task = Task(env="tiny", id="t", source=str(path))
    runtime = LocalRuntime(path)
    endpoint = await runtime.acquire(task, "agent-import")
    try:
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        prompt = await steps.start(StartInput(endpoint=endpoint, session=session, task=task))
        inp = AgentInput(endpoint=endpoint, session=session, task=task, prompt=prompt,
                         agent=AgentSpec(path="no_such_module_xyz:Agent"), rollout_id="r")
        with pytest.raises(ConfigError, match="no_such_module_xyz"):
            await steps.run_agent(inp)
        result = await steps.run_agent(inp.model_copy(update={"agent": AgentSpec(path="fixed", config={"answer": "ok"})}))
        assert result.content == "ok" and result.trace_ref is not None
    finally:
        await runtime.release(endpoint)
        await runtime.release(endpoint)  # idempotent
