"""The Rollout workflow's shape, with stub activities under the real activity names.

``temporalio.testing.WorkflowEnvironment`` runs a real dev server; each test registers stubs
named like the product's activities (``rollouts.provision`` ...) and reads what happened from
the workflow's own history (``history_scan.step_names``), never from a log of ours: the step
sequence, one step's retries, the agent's heartbeat timeout, a worker lost between steps, a
cancelled rollout's teardown, and the verifier's steps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from history_scan import local_activity, step_events, step_names
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_rollouts.models import AgentSpec, Endpoint, Grade, ProviderSpec, Session, Task
from durable_rollouts.step_io import (
    AgentInput,
    AgentResult,
    ConnectInput,
    GradeInput,
    ProvisionInput,
    Started,
    StartInput,
    TeardownInput,
    VerifierSession,
    VerifyInput,
)
from durable_rollouts.temporal.codec import PYDANTIC_CONVERTER
from durable_rollouts.temporal.connection import temporal_cli
from durable_rollouts.workflows import Rollout
from durable_rollouts.workflows import types as wf
from durable_rollouts.workflows.types import CARD_LAYOUT, SEARCH_ATTRIBUTES, RolloutInput

CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one dev server for the module


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    keys = [SearchAttributeKey.for_float(n) if t == "Double" else SearchAttributeKey.for_keyword(n)
            for n, t in SEARCH_ATTRIBUTES.items()]
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=PYDANTIC_CONVERTER,
        search_attributes=keys, dev_server_extra_args=["--dynamic-config-value",
                                                        "history.transferProcessorMaxPollRPS=1000"])
    yield environment
    await environment.shutdown()


class Stubs:
    """Activities under the product's names; ``fail`` maps a step to how many attempts fail."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, int] = {}
        self.queue: Callable[[int], str | None] = lambda n: None  # provision's substrate queue
        self.gone_queues: set[str] = set()  # substrates on these queues refuse connections
        self.agent_behaviour: Callable[[int], Any] | None = None
        self.torn_down = asyncio.Event()

    def _count(self, step: str) -> int:
        self.calls[step] += 1
        if self.calls[step] <= self.fail.get(step, 0):
            raise RuntimeError(f"{step} failed on purpose (call {self.calls[step]})")
        return self.calls[step]

    def all(self) -> list[Any]:
        session = Session(session_id="s1", env_name="stub", env_version="1")

        @activity.defn(name=wf.ACT_PROVISION)
        async def provision(inp: ProvisionInput) -> Endpoint:
            n = self._count("provision")
            return Endpoint(url="tcp://127.0.0.1:1", provider=ProviderSpec(kind="stub"), key=inp.key,
                            task_queue=self.queue(n))

        @activity.defn(name=wf.ACT_CONNECT)
        async def connect(inp: ConnectInput) -> Session:
            self._count("connect")
            if inp.endpoint.task_queue in self.gone_queues:  # as a real connect: refused
                raise ApplicationError("substrate refuses connections", type=wf.ERR_SUBSTRATE_GONE,
                                       non_retryable=True)
            return session

        @activity.defn(name=wf.ACT_START)
        async def start(inp: StartInput) -> Started:
            self._count("start")
            return Started(session=session, prompt={"prompt": "say 4"})

        @activity.defn(name=wf.ACT_AGENT)
        async def agent(inp: AgentInput) -> AgentResult:
            n = self._count("agent")
            if self.agent_behaviour is not None:
                await self.agent_behaviour(n)
            return AgentResult(content="4")

        @activity.defn(name=wf.ACT_GRADE)
        async def grade(inp: GradeInput) -> Grade:
            self._count("grade")
            return Grade(reward=1.0 if inp.answer == "4" else 0.0, raw={"score": 1.0})

        @activity.defn(name=wf.ACT_VERIFY_OPEN)
        async def verify_open(inp: VerifyInput) -> VerifierSession:
            self._count("verify_open")
            return VerifierSession(endpoint=inp.actor_endpoint, session=session, owned=False)

        @activity.defn(name=wf.ACT_VERIFY)
        async def verify(inp: VerifyInput) -> Grade:
            self._count("verify")
            return Grade(reward=0.5)

        @activity.defn(name=wf.ACT_VERIFY_CLOSE)
        async def verify_close(opened: VerifierSession) -> None:
            self._count("verify_close")

        @activity.defn(name=wf.ACT_TEARDOWN)
        async def teardown(inp: TeardownInput) -> None:
            self._count("teardown")
            self.torn_down.set()

        return [provision, connect, start, agent, grade, verify_open, verify, verify_close, teardown]


def _input(queue: str, *, verifier: bool = False, **extra: Any) -> RolloutInput:
    task = Task(env="stub", id="add", args={"a": 2, "b": 2})
    if verifier:
        task = task.model_copy(update={"verifier": Task(env="stub", id="check")})
    return RolloutInput(rollout_id=f"r-{uuid.uuid4().hex[:8]}", job_id="j", group_id="g", group_index=0,
                        row_index=0, task=task, agent=AgentSpec(path="stub"),
                        provider=ProviderSpec(kind="stub"), task_queue=queue, local_steps=True,
                        search_attributes=True, layout=CARD_LAYOUT, **extra)


async def _run(client: Client, stubs: Stubs, inp: RolloutInput) -> tuple[Any, Any]:
    async with Worker(client, task_queue=inp.task_queue, workflows=[Rollout], activities=stubs.all(),
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(Rollout.run, inp, id=inp.rollout_id, task_queue=inp.task_queue)
        result = await handle.result()
        return result, await handle.fetch_history()


def _attempts(history: Any, activity_type: str) -> int:
    """The attempt that completed ``activity_type`` (a local activity's marker or a started event)."""
    for event in history.events:
        data = local_activity(event)
        if data is not None and data.get("activity_type") == activity_type:
            return int(data["attempt"])
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")}
    for event in history.events:
        if event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == activity_type:
                return attrs.attempt
    raise AssertionError(f"{activity_type} did not run")


async def test_a_rollout_walks_the_card_steps_in_order(env: WorkflowEnvironment) -> None:
    stubs = Stubs()
    result, history = await _run(env.client, stubs, _input(f"q-{uuid.uuid4().hex[:8]}"))
    assert result.status == "succeeded" and result.reward == 1.0
    assert step_names(history) == CARD
    kinds = dict(step_events(history))
    assert kinds == {"rollouts.provision": "local", "rollouts.connect": "local", "rollouts.start": "local",
                     "rollouts.agent": "activity", "rollouts.grade": "local", "rollouts.teardown": "local"}


async def test_a_failing_grade_retries_alone(env: WorkflowEnvironment) -> None:
    stubs = Stubs()
    stubs.fail["grade"] = 2  # fails twice, then passes
    result, history = await _run(env.client, stubs, _input(f"q-{uuid.uuid4().hex[:8]}"))
    assert result.status == "succeeded" and result.reward == 1.0
    assert step_names(history) == CARD  # no step ran twice in history
    assert _attempts(history, "rollouts.grade") == 3
    assert all(_attempts(history, f"rollouts.{s}") == 1 for s in CARD if s != "grade")
    assert stubs.calls == Counter({s: 1 for s in CARD} | {"grade": 3})


@pytest.mark.slow  # waits out a heartbeat timeout (~4 s)
async def test_an_agent_that_stops_heartbeating_is_retried_after_its_heartbeat_timeout(
        env: WorkflowEnvironment) -> None:
    stubs = Stubs()

    async def hang_first(n: int) -> None:
        if n == 1:
            await asyncio.sleep(30)  # no heartbeat: the 3 s heartbeat timeout fires first

    stubs.agent_behaviour = hang_first
    result, history = await _run(env.client, stubs, _input(f"q-{uuid.uuid4().hex[:8]}",
                                                           agent_heartbeat_s=3.0))
    assert result.status == "succeeded"
    assert step_names(history) == CARD
    started = [e.activity_task_started_event_attributes for e in history.events
               if e.HasField("activity_task_started_event_attributes")]
    (agent_started,) = started
    assert agent_started.attempt == 2
    assert agent_started.last_failure.timeout_failure_info.timeout_type == 4  # TIMEOUT_TYPE_HEARTBEAT


async def test_a_worker_lost_between_steps_makes_the_rollout_reprovision(env: WorkflowEnvironment) -> None:
    """Provision (attempt 1) placed the substrate on worker A, which is gone: connect runs beside
    the workflow (a local activity, as on one worker), finds the substrate refusing connections,
    and a new attempt reprovisions."""
    stubs = Stubs()
    lost = f"worker-a-{uuid.uuid4().hex[:6]}"
    stubs.queue = lambda n: lost if n == 1 else None
    stubs.gone_queues = {lost}
    inp = _input(f"q-{uuid.uuid4().hex[:8]}", queue_timeout_s=1.0)
    result, history = await _run(env.client, stubs, inp)
    assert result.status == "succeeded" and result.attempts == 2
    assert "attempt 1 (connecting)" in (result.error or "")
    assert step_names(history) == ["provision", "connect", "teardown", *CARD]
    events = step_events(history)
    assert events[1] == ("rollouts.connect", "local") and events[2] == ("rollouts.teardown", "local")


async def test_a_pinned_substrate_runs_its_cheap_steps_beside_the_workflow(env: WorkflowEnvironment) -> None:
    """A substrate on another queue (a ``rollouts worker``'s process queue) costs what it costs on
    one worker: connect, start, grade and teardown are local activities; only the agent step,
    which heartbeats, is scheduled on the substrate's queue. If nobody polls that queue (nor its
    liveness queue: the probe goes unanswered), the agent step is lost and the rollout
    reprovisions."""
    stubs = Stubs()
    lost = f"worker-a-{uuid.uuid4().hex[:6]}"
    stubs.queue = lambda n: lost if n == 1 else None
    inp = _input(f"q-{uuid.uuid4().hex[:8]}", queue_timeout_s=1.0)
    result, history = await _run(env.client, stubs, inp)
    assert result.status == "succeeded" and result.attempts == 2
    assert "attempt 1 (agent loop)" in (result.error or "")
    assert step_names(history)[:7] == ["provision", "connect", "start", "agent", "queue_alive",
                                       "teardown", "provision"]
    kinds = step_events(history)[:6]
    assert [k for _, k in kinds] == ["local", "local", "local", "activity", "activity", "local"]
    scheduled = [e.activity_task_scheduled_event_attributes for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled[0].task_queue.name == lost  # the agent step went to the substrate's queue
    assert any(e.HasField("marker_recorded_event_attributes")
               and e.marker_recorded_event_attributes.marker_name == "core_patch" for e in history.events)


async def test_a_cancelled_rollout_still_tears_down(env: WorkflowEnvironment) -> None:
    stubs = Stubs()

    async def work_until_cancelled(n: int) -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.2)

    stubs.agent_behaviour = work_until_cancelled
    inp = _input(f"q-{uuid.uuid4().hex[:8]}")
    async with Worker(env.client, task_queue=inp.task_queue, workflows=[Rollout], activities=stubs.all(),
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await env.client.start_workflow(Rollout.run, inp, id=inp.rollout_id,
                                                 task_queue=inp.task_queue)
        for _ in range(100):
            if stubs.calls["agent"]:
                break
            await asyncio.sleep(0.1)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        assert isinstance(failed.value.cause, CancelledError)
        history = await handle.fetch_history()
    assert step_names(history) == CARD[:4] + ["teardown"]
    assert stubs.torn_down.is_set()


async def test_a_verifier_task_runs_the_verify_steps_before_teardown(env: WorkflowEnvironment) -> None:
    stubs = Stubs()
    result, history = await _run(env.client, stubs, _input(f"q-{uuid.uuid4().hex[:8]}", verifier=True))
    assert result.status == "succeeded" and result.reward == 0.5  # the verifier's grade
    assert step_names(history) == ["provision", "connect", "start", "agent", "grade",
                                   "verify_open", "verify", "verify_close", "teardown"]

