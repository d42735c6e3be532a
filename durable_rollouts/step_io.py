"""Pure data models of the rollout steps: one pydantic input per step, and what each returns.

``provision -> connect -> start -> agent -> grade -> [verify] -> teardown``: these are the
payloads of the ``Rollout`` workflow's activities, so they are recorded in workflow history and
must keep decoding histories of older releases (fields are only ever added, with defaults).
The models of the merged steps older releases ran (``Opened``, ``OpenSpec``, ``AgentInput.open``
and ``.close``) stay for that reason. Imports pydantic, ``durable_rollouts.models`` and ``admission`` only, so
workflows may import it inside their sandbox.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from durable_rollouts.admission import AdmissionTicket
from durable_rollouts.models import (
    AgentSpec,
    Endpoint,
    Grade,
    ProviderSpec,
    Session,
    Step,
    StrictModel,
    Task,
    TraceRef,
)

__all__ = [
    "AgentInput",
    "AgentResult",
    "Checkpoint",
    "CheckpointFence",
    "ConnectInput",
    "GradeInput",
    "OpenSpec",
    "Opened",
    "ProvisionInput",
    "StartInput",
    "Started",
    "TeardownInput",
    "VerifierSession",
    "VerifyInput",
    "graded_outcome",
]

_Model = StrictModel



class ProvisionInput(_Model):
    """Place ``task``'s environment with ``provider``; idempotent per ``key`` (the rollout id)."""

    key: str
    task: Task
    provider: ProviderSpec
    admission: AdmissionTicket | None = None  # fleet-wide admission: report the start there


class ConnectInput(_Model):
    endpoint: Endpoint
    ready_timeout_s: float | None = None


class StartInput(_Model):
    """Start ``task`` in ``session``.

    ``with_session``: return :class:`Started` (the prompt and the session the task runs in) instead
    of the prompt frame alone. Rollouts of the card's shape ask for it: a server that keeps no
    task-less session across connections (HUD's) starts the task in a new session, which the
    later steps must resume. Older histories' start steps returned the prompt frame.
    """

    endpoint: Endpoint
    session: Session
    task: Task
    with_session: bool = False


class Started(_Model):
    """What the start step returns to a Rollout of the card's shape."""

    session: Session
    prompt: dict[str, Any] = Field(default_factory=dict)


class Opened(_Model):
    """What the merged open step (provision -> connect -> start, one activity) returns.

    ``ephemeral``: the substrate lives in the worker process that opened it and dies with it
    (``LocalRuntime``), so nothing of it can outlive a crash and grade + teardown may run as one step.
    """

    endpoint: Endpoint
    session: Session
    prompt: dict[str, Any]
    ephemeral: bool = False


class CheckpointFence(_Model):
    """Which agent activity wrote (or asks for) a checkpoint: the workflow's schedule number of
    the agent step and Temporal's attempt number. A lower fence than the newest seen is a zombie."""

    schedule: int = 0
    attempt: int = 1

    def key(self) -> tuple[int, int]:
        return (self.schedule, self.attempt)


class Checkpoint(_Model):
    """A durable snapshot of an agent mid-run (``Run.checkpoint``): its JSON-able ``state`` plus
    the trace steps recorded so far.

    Sent to the ``Rollout`` workflow as a delta: ``steps`` are the trace steps from index
    ``first_step`` on (the earlier ones are already durable). ``latest_checkpoint`` answers with
    every step (``first_step == 0``). ``turn`` / ``last_tool`` are for progress displays.
    """

    state: Any = None
    steps: list[Step] = Field(default_factory=list)
    first_step: int = 0
    fence: CheckpointFence = Field(default_factory=CheckpointFence)
    turn: int | None = None
    last_tool: str | None = None


class OpenSpec(_Model):
    """What an agent step that opens its own substrate needs (``AgentInput.open``, layout 4)."""

    key: str  # the substrate key of this rollout attempt (``ProvisionInput.key``)
    provider: ProviderSpec


class AgentInput(_Model):
    """The agent step's input: the parked session it works on, or (``open``) what to open it with."""

    # None only with ``open``: the step opens the substrate itself and fills these in.
    endpoint: Endpoint | None = None
    session: Session | None = None
    task: Task
    prompt: dict[str, Any] = Field(default_factory=dict)
    agent: AgentSpec
    rollout_id: str  # stable across the batch's fresh re-runs (``retry``)
    job_id: str = ""
    group_id: str = ""
    group_index: int = 0
    row_index: int = 0
    retry: int = 0  # the batch's fresh re-runs before this one (``Run.attempt`` = retry + 1)
    policy_version: int | None = None  # the trainer's policy to sample with (``Job.set_policy``)
    policy_endpoint: str | None = None
    timeout_s: float | None = None
    checkpoint: Checkpoint | None = None  # the latest checkpoint, when the step is scheduled anew
    schedule: int = 0  # which schedule of the agent step this is (checkpoint fencing)
    # Grade and tear down in this step once the agent is done (a substrate that dies with its
    # worker, no verifier): saves the close step. A grade that cannot be had is left to it.
    close: bool = False
    # Layout 4: open the substrate in this step first (provision -> connect -> start), then work,
    # grade and tear down as with ``close``: the whole rollout is one activity.
    open: OpenSpec | None = None

    def on(self, opened: Opened) -> AgentInput:
        """This input on the substrate ``opened`` (an ``open`` step, once it has opened it)."""
        return self.model_copy(update={"endpoint": opened.endpoint, "session": opened.session,
                                       "prompt": opened.prompt, "open": None, "close": True})


class GradeInput(_Model):
    endpoint: Endpoint
    session: Session
    answer: str | None = None
    agent_error: str | None = None


class VerifyInput(_Model):
    """Grade ``task.verifier`` with the actor's result (``actor_raw``), never re-running the agent."""

    task: Task
    actor_endpoint: Endpoint
    actor_session: Session
    actor_raw: dict[str, Any] = Field(default_factory=dict)
    provider: ProviderSpec
    key: str
    # Set by the recorded verify (``VerifierSession`` from ``rollouts.verify_open``): grade there.
    verifier_endpoint: Endpoint | None = None
    verifier_session: Session | None = None


class VerifierSession(_Model):
    """The verifier's started session, recorded in history before it grades (``verify_open``).

    ``owned``: the verifier has its own substrate (released at close), else it is a session on
    the actor's server (only the session is ended).
    """

    endpoint: Endpoint
    session: Session
    owned: bool = True


class TeardownInput(_Model):
    endpoint: Endpoint
    session: Session | None = None


class AgentResult(_Model):
    """What the agent step returns: the answer plus a claim check for the full trace."""

    content: str | None = None
    status: str = "completed"
    stop_reason: str | None = None
    error: str | None = None
    trace_ref: TraceRef | None = None
    # Set when the step also graded and tore the substrate down (``AgentInput.close``).
    grade: Grade | None = None
    # Set when the step opened the substrate (``AgentInput.open``) but could not grade it: it is
    # still up, and the workflow's close step grades it and tears it down.
    opened: Opened | None = None


def graded_outcome(agent: AgentResult, grade: Grade) -> tuple[str, str | None, str | None]:
    """``(status, error_phase, error)`` of a rollout whose agent ran and that was graded.

    An agent timeout is ``timeout``; then a grade error is ``errored`` in ``grading``; then an
    agent that failed (its exception, recorded in the trace) is ``errored`` in ``agent loop`` with
    the exception's message; else ``succeeded``. Shared by the Rollout workflow and the direct
    executor (which reports an agent timeout as ``errored``).
    """
    if agent.status == "timeout" or agent.stop_reason == "timeout":
        return "timeout", "agent loop", agent.error or "agent timed out"
    if grade.is_error:
        return "errored", "grading", grade.content or "grade error"
    if agent.status == "error" or agent.error:
        return "errored", "agent loop", agent.error or "agent failed"
    return "succeeded", None, None

