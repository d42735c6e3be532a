"""The step functions classify failures at the edge: user mistakes, a lost substrate, results."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from durable_rollouts.activities import legacy_steps as merged_steps
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import (
    ConfigError,
    RemoteTaskError,
    ServerBusyError,
    SubstrateGoneError,
)
from durable_rollouts.models import (
    AgentSpec,
    Session,
    Task,
)
from durable_rollouts.runtimes import LocalRuntime, Runtime
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.run import Run
from durable_rollouts.step_io import (
    AgentInput,
    ConnectInput,
    GradeInput,
    StartInput,
    TeardownInput,
)
from durable_rollouts.steps import agent as agent_step
from durable_rollouts.steps import substrate as steps

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
            await agent_step.run_agent(inp, agent=load_agent(inp.agent), new_run=Run.for_step)
        fixed = inp.model_copy(update={"agent": AgentSpec(path="fixed", config={"answer": "ok"})})
        result = await agent_step.run_agent(fixed, agent=load_agent(fixed.agent), new_run=Run.for_step)
        assert result.content == "ok" and result.trace_ref is not None
    finally:
        await runtime.release(endpoint)
        await runtime.release(endpoint)  # idempotent


async def test_a_refused_resume_is_gone_quickly_without_waiting_out_the_resume_timeout() -> None:
    """No probe connection before a resume any more: the resume itself gives up after a few
    refusals (about 0.3 s), instead of retrying for the whole 30 s resume timeout."""
    import time

    endpoint = await Runtime(f"tcp://127.0.0.1:{_free_port()}").acquire(Task(env="x", id="y"), "k")
    session = Session(session_id="gone", env_name="x", env_version="0")
    began = time.monotonic()
    with pytest.raises(SubstrateGoneError, match="refuses connections"):
        await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="1"))
    assert time.monotonic() - began < 5.0


class _CountingRuntime(LocalRuntime):
    """A LocalRuntime that counts acquires and releases (the env is served in this process)."""

    def __init__(self) -> None:
        super().__init__(env)
        self.acquired: list[str] = []
        self.released: list[str] = []

    async def acquire(self, task: Task, key: str):  # type: ignore[override]
        self.acquired.append(key)
        return await super().acquire(task, key)

    async def release(self, endpoint) -> None:  # type: ignore[override]
        self.released.append(endpoint.key)
        await super().release(endpoint)


async def test_open_rollout_names_the_phase_that_failed_and_releases_the_substrate() -> None:
    """provision -> connect -> start in one step: a rejected start is a ConfigError of phase
    'starting task', and the substrate it provisioned is released before the error is raised."""
    from durable_rollouts.errors import StepFailed

    runtime = _CountingRuntime()
    with pytest.raises(StepFailed) as caught:
        await merged_steps.open_rollout(Task(env="steps", id="needs_int", args={"n": "x"}), "k1", runtime)
    assert caught.value.phase == "starting task" and isinstance(caught.value.cause, ConfigError)
    assert runtime.acquired == runtime.released == ["k1"]

    opened = await merged_steps.open_rollout(Task(env="steps", id="needs_int", args={"n": 3}), "k2", runtime)
    assert opened.prompt["prompt"] == "n=3" and opened.ephemeral and opened.session.env_name == "steps"
    grade = await merged_steps.close_rollout(GradeInput(endpoint=opened.endpoint, session=opened.session,
                                                 answer="3"), provider=runtime)
    assert grade.reward == 1.0 and not grade.is_error
    assert runtime.released == ["k1", "k2"]  # close_rollout graded and released in one step


async def test_close_rollout_raises_a_failed_grade_and_tears_nothing_down() -> None:
    """A grade that cannot reach its session is raised; teardown is left to the caller."""
    runtime = _CountingRuntime()
    opened = await merged_steps.open_rollout(Task(env="steps", id="no_score"), "k3", runtime)
    stale = opened.session.model_copy(update={"session_id": "not-a-session"})
    with pytest.raises(SubstrateGoneError, match="not-a-session"):
        await merged_steps.close_rollout(GradeInput(endpoint=opened.endpoint, session=stale, answer="1"),
                                  provider=runtime)
    assert runtime.released == []
    await steps.teardown_with(opened.endpoint, opened.session, runtime)
    assert runtime.released == ["k3"]
