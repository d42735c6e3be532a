"""Pure data models shared by every layer: tasks, runtime config, grades, traces, step I/O.

Only pydantic and the standard library are imported here, so Temporal workflows may import this
module inside their sandbox. Anything with behaviour (providers, clients, agents, Job/Run) lives
in ``durable_rollouts.sdk``; anything with I/O lives in activities.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AgentSpec",
    "ERROR_STATUSES",
    "RETRYABLE_STATUSES",
    "Endpoint",
    "Grade",
    "Limits",
    "ProviderSpec",
    "Resources",
    "ResultsRef",
    "RetryAttempt",
    "RolloutResult",
    "RolloutStatus",
    "RuntimeConfig",
    "RuntimeGPU",
    "RuntimeLimits",
    "RuntimeResources",
    "ServerKind",
    "Session",
    "Step",
    "StrictModel",
    "SubScore",
    "Task",
    "TaskCall",
    "Trace",
    "TraceRef",
    "task_slug",
]


class StrictModel(BaseModel):
    """The base of every boundary model: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


_Model = StrictModel


# ---------------------------------------------------------------------------------------------
# Runtime configuration


class RuntimeGPU(_Model):
    """GPUs a row asks for: ``count`` of them, of ``type`` (or one of a list of types) if given."""

    type: str | list[str] | None = None
    count: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _types_are_named(self) -> RuntimeGPU:
        if self.type is not None and not (self.types and all(self.types)):
            raise ValueError(f"gpu type must name a GPU type (or a list of them): {self.type!r}")
        return self

    @property
    def types(self) -> list[str]:
        """The acceptable GPU types ([] = any)."""
        if self.type is None:
            return []
        return [self.type] if isinstance(self.type, str) else list(self.type)


class RuntimeResources(_Model):
    """CPU, memory and GPUs a row asks of its substrate.

    ``gpu`` also takes a plain count (the shape before ``RuntimeGPU``; rows, files and recorded
    workflow histories still carry it): ``gpu=2`` means two GPUs of any type, ``gpu=0`` none.
    """

    cpu: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    gpu: RuntimeGPU | None = None

    @model_validator(mode="before")
    @classmethod
    def _gpu_count(cls, data: Any) -> Any:
        value = data.get("gpu") if isinstance(data, dict) else None
        if isinstance(value, bool):
            raise ValueError("gpu must be a RuntimeGPU(type, count) or a count, not a bool")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"a gpu count must be >= 0, not {value}")
            return {**data, "gpu": {"count": value} if value else None}
        return data


class RuntimeLimits(_Model):
    """How long a substrate may take to answer ``hello``, and to live, in seconds."""

    startup_timeout_s: float | None = Field(default=None, gt=0)
    run_timeout_s: float | None = Field(default=None, gt=0)


Resources = RuntimeResources
"""The former name of :class:`RuntimeResources`."""
Limits = RuntimeLimits
"""The former name of :class:`RuntimeLimits`."""


class RuntimeConfig(_Model):
    """What a row asks of its substrate. A provider rejects any field it cannot honour."""

    image: str | None = None
    resources: RuntimeResources = Field(default_factory=RuntimeResources)
    limits: RuntimeLimits = Field(default_factory=RuntimeLimits)

    def set_fields(self) -> set[str]:
        """Dotted names of every field that is set (``resources.cpu``, ``image`` ...).

        A GPU request is ``resources.gpu``, plus ``resources.gpu.type`` when it names a type.
        """
        out: set[str] = set()
        if self.image is not None:
            out.add("image")
        for group in ("resources", "limits"):
            for name, value in getattr(self, group).model_dump().items():
                if value is not None:
                    out.add(f"{group}.{name}")
        if self.resources.gpu is not None and self.resources.gpu.type is not None:
            out.add("resources.gpu.type")
        return out


# ---------------------------------------------------------------------------------------------
# Tasks


def task_slug(id: str, args: dict[str, Any] | None, digits: int = 8) -> str:
    """A row's default slug, derived exactly as HUD v6 derives it (results join across tools).

    The id alone when ``args`` is empty; otherwise the id, ``-`` and the first ``digits`` (8)
    hex digits of the SHA-1 of the args as ``json.dumps(args, sort_keys=True, default=str)`` (the
    standard separators, ASCII escapes). A taskset gives a row whose 8 digits collide with an
    earlier row's (likely past ~77,000 rows of one task id) 16, then 40 (``Taskset``).
    """
    if not args:
        return id
    text = json.dumps(args, sort_keys=True, default=str)
    return f"{id}-{hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:digits]}"


def _near_miss(key: str, known: Iterable[str]) -> str | None:
    """The known field name ``key`` is most likely a typo of, if any."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return close[0] if close else None


class Task(BaseModel):
    """One row of a taskset: which env, which task template, which args — pure data.

    ``source`` says where the environment lives (an ``env.py`` path, a module, an image); a
    provider may use it or ignore it. ``verifier`` is an agent-less Task graded with this task's
    result; verifiers cannot be nested.

    ``slug`` names the row in a taskset, in rollout ids and in results: a row that carries one
    keeps it (as HUD does; rows recorded by earlier releases carry theirs), a row without one gets
    :func:`task_slug`. ``validation``, ``agent_config`` and ``columns`` are HUD v6 row fields,
    kept and written back; any other field a HUD row carries is kept too (``model_extra``) and
    written back by ``to_file``, except a near-miss of a known field (``arg``), which is a typo.
    """

    model_config = ConfigDict(extra="allow")

    env: str
    id: str
    args: dict[str, Any] = Field(default_factory=dict)
    slug: str = ""
    source: str | None = None
    runtime_config: RuntimeConfig | None = None
    verifier: Task | None = None
    validation: list[dict[str, Any]] | None = None
    agent_config: dict[str, Any] | None = None
    columns: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _reject_typos(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if isinstance(key, str) and key not in cls.model_fields:
                    guess = _near_miss(key, cls.model_fields)
                    if guess is not None:
                        raise ValueError(f"unknown task field {key!r} (did you mean {guess!r}?)")
        return data

    async def run(self, agent: Any, runtime: Any = None, **options: Any) -> Any:
        """Run this row once, durably, and return the Job (seeds 002/004: ``await task.run(agent)``).

        A batch of one through ``Taskset.run``; ``runtime=None`` serves the row from the env
        file it names, and ``options`` are ``Taskset.run``'s (``group``, ``temporal`` ...).
        """
        import durable_rollouts  # the package root's lazy names: no import edge to sdk/

        return await durable_rollouts.Taskset(self.id, [self]).run(agent, runtime=runtime, **options)

    @model_validator(mode="after")
    def _derive_slug(self) -> Task:
        if not self.slug:
            self.slug = task_slug(self.id, self.args)
        return self

    @model_validator(mode="after")
    def _no_nested_verifier(self) -> Task:
        if self.verifier is not None and self.verifier.verifier is not None:
            raise ValueError("verifiers cannot be nested: a verifier task has its own verifier")
        return self


# ---------------------------------------------------------------------------------------------
# Specs that reach workers (import path + config, rebuilt on each worker)


class AgentSpec(_Model):
    """An agent as data: ``module:Class`` (or a built-in short name) plus its config."""

    path: str
    config: dict[str, Any] = Field(default_factory=dict)


class ProviderSpec(_Model):
    """A provider as data: its kind (built-in name or ``module:Class``) plus options."""

    kind: str
    options: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Step I/O


class Endpoint(_Model):
    """Where a provisioned substrate answers, and what it takes to release it.

    ``handle`` is provider-specific (pid, container id ...). ``task_queue`` is set when the
    substrate is reachable only from the host that provisioned it: later steps run there.
    An Endpoint is recorded in workflow history, so built-in providers put no token here:
    ``params["token_from"] == "key"`` says the token is derived from ``key`` (``sdk.tokens``).
    """

    url: str
    # params may still carry a token (a borrowed Runtime, older histories): keep it out of reprs.
    params: dict[str, Any] = Field(default_factory=dict, repr=False)
    config: RuntimeConfig | None = None
    provider: ProviderSpec
    key: str
    handle: dict[str, Any] = Field(default_factory=dict)
    task_queue: str | None = None


ServerKind = Literal["rollouts", "hud"]
"""Which server answers a control channel: ours, or a HUD v6 one (``hud serve``, hud's
``server.bind``), which keeps no task-less or graded session once its connection closes."""


class Session(_Model):
    """A control-channel session opened by ``connect``; later steps resume it by id."""

    session_id: str
    env_name: str
    env_version: str
    bindings: list[dict[str, Any]] = Field(default_factory=list)
    server: ServerKind = "rollouts"


class SubScore(_Model):
    name: str
    value: float
    weight: float = 1.0
    info: dict[str, Any] = Field(default_factory=dict)


class Grade(_Model):
    """A graded result. ``raw`` is the env's grade frame as received."""

    reward: float = 0.0
    done: bool = True
    content: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    is_error: bool = False
    raw: dict[str, Any] = Field(default_factory=dict)
    subscores: list[SubScore] = Field(default_factory=list)

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Grade:
        """Build from a ``tasks.grade`` result; ``score`` must be a number, not a bool."""
        score = frame.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise ValueError(f"grade frame has no numeric score: {frame!r}")
        subs = [SubScore.model_validate(s) for s in frame.get("subscores", []) if isinstance(s, dict)]
        info = frame.get("info") if isinstance(frame.get("info"), dict) else {}
        content = frame.get("content")
        return cls(
            reward=float(score),
            done=bool(frame.get("done", True)),
            content=None if content is None else str(content),
            info=info,
            raw=dict(frame),
            subscores=subs,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Grade:
        """HUD's name of :meth:`from_frame` (a ``tasks.grade`` result dict)."""
        return cls.from_frame(data)

    @classmethod
    def error(cls, message: str, raw: dict[str, Any] | None = None) -> Grade:
        return cls(reward=0.0, is_error=True, content=message, raw=raw or {})


class TaskCall(_Model):
    phase: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any = None


class Step(_Model):
    """One recorded step of a rollout's trace."""

    index: int = 0
    source: Literal["user", "agent", "tool", "task", "subagent", "system"]
    messages: list[dict[str, Any]] = Field(default_factory=list)
    task_call: TaskCall | None = None
    error: str | None = None
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class Trace(_Model):
    """Everything the agent did, plus its final answer in ``content``."""

    trace_id: str = ""
    steps: list[Step] = Field(default_factory=list)
    status: Literal["running", "completed", "error", "cancelled"] = "running"
    stop_reason: Literal["done", "max_steps", "length", "timeout", "malformed_tool_call", "error"] | None = None
    content: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    def record(self, step: Step) -> Step:
        step.index = len(self.steps)
        self.steps.append(step)
        return step

    @property
    def is_error(self) -> bool:
        return self.status == "error"


class TraceRef(_Model):
    """A claim check for a trace kept out of workflow history."""

    uri: str
    size: int = 0


RolloutStatus = Literal["succeeded", "errored", "failed", "cancelled", "timeout"]
RETRYABLE_STATUSES = frozenset({"errored", "timeout"})
"""Statuses a batch re-runs fresh when its ``retries`` allow."""
ERROR_STATUSES = frozenset({"errored", "timeout", "failed"})
"""A rollout in one of these, once retries are spent, is an unrecovered error (``on_error``)."""


class RetryAttempt(_Model):
    """One earlier run of a rollout that a batch re-ran fresh (``Taskset.run(retries=N)``)."""

    workflow_id: str  # the Rollout child that ran it (``<rollout_id>`` or ``<rollout_id>-r<n>``)
    status: RolloutStatus
    reward: float | None = None
    error: str | None = None
    error_phase: str | None = None


class ResultsRef(StrictModel):
    """A claim check for a chunk of RolloutResults flushed out of workflow state."""

    uri: str
    count: int


class RolloutResult(_Model):
    """Compact per-rollout outcome, small enough to keep many in a workflow.

    ``reward`` is the grade's reward when there is a valid grade, whatever the status; only a
    ``succeeded`` rollout's reward counts (``Run.reward``). ``retries`` counts fresh re-runs by the
    batch (``retry_history`` has the earlier ones, oldest first).
    """

    rollout_id: str
    slug: str
    group_id: str
    group_index: int
    row_index: int = 0
    status: RolloutStatus
    reward: float | None = None
    grade: Grade | None = None
    attempts: int = 1
    error: str | None = None
    error_phase: str | None = None
    trace_ref: TraceRef | None = None
    started_at: float | None = None
    ended_at: float | None = None
    retries: int = 0
    retry_history: list[RetryAttempt] = Field(default_factory=list)
    policy_version: int | None = None  # the policy version it sampled with (``Job.set_policy``)

