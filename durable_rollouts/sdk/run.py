"""``Run``: what an agent receives while it works, and what a ``Job`` keeps afterwards.

During the agent step a Run carries the live control-channel client and the checkpoint hook
(``await run.checkpoint(state)``, ``run.restored_state``); once the rollout is over the same object
holds the grade, status and trace. Imports models and errors only (the client type is for type
checking); the durable checkpointer is injected by the activity, so this stays Temporal-free.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidStateError
from ..models import (
    Grade,
    RetryAttempt,
    RolloutResult,
    Step,
    Task,
    Trace,
    TraceRef,
)
from ..step_io import AgentInput, Checkpoint

if TYPE_CHECKING:
    from ..client.envclient import EnvClient

__all__ = ["Run"]


@dataclass
class Run:
    """One rollout: the task, its prompt, the agent's trace and (after grading) the grade.

    Attributes:
        task: the (resolved) task row; None for runs rebuilt from compact results only.
        prompt: the prompt frame returned by ``tasks.start``.
        bindings: capabilities the env exposes (from ``hello``).
        client: the connected ``EnvClient`` while the agent runs, else None.
        trace: what the agent did; the final answer goes in ``trace.content``.
        status: ``succeeded``, ``errored``, ``failed``, ``cancelled`` or ``timeout``.
        error_phase: where a failure happened (``provisioning``, ``agent loop``, ...).
        rollout_id: stable across the batch's fresh re-runs (``retries``), so results, exports
            and the trainer stream key on it.
        group_index: which member of its group this run is (0 .. group - 1).
        row_index: the taskset row it ran.
        attempt: 1 on the first run of this rollout, n + 1 on the batch's n-th fresh re-run.
        policy_version: the trainer's policy version this run samples with (``Job.set_policy``;
            None when the job has none); ``policy_endpoint`` where that policy is served.
        retries: fresh re-runs the batch gave it (``retry_history``: the earlier outcomes).
        dropped: its group had an unrecovered error under ``on_error="drop_group"``: it is
            exported with ``dropped: true`` and left out of every statistic.
        restored_state: the state of the last :meth:`checkpoint` of an earlier attempt of this
            agent step (its trace steps are already back in ``trace``); None on a first attempt.
    """

    task: Task | None = None
    prompt: dict[str, Any] = field(default_factory=dict)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    client: EnvClient | None = None
    trace: Trace = field(default_factory=Trace)
    job_id: str = ""
    group_id: str = ""
    rollout_id: str = ""
    slug: str = ""
    group_index: int = 0
    row_index: int = 0
    grade: Grade | None = None
    attempts: int = 1
    attempt: int = 1
    policy_version: int | None = None
    policy_endpoint: str | None = None
    status: str = "running"
    error: str | None = None
    error_phase: str | None = None
    trace_ref: TraceRef | None = None
    retries: int = 0
    retry_history: list[RetryAttempt] = field(default_factory=list)
    dropped: bool = False
    restored_state: Any = None
    checkpoints: int = 0
    # Makes a checkpoint durable (the agent activity sends a workflow update); None = local only.
    _checkpointer: Callable[[Checkpoint], Awaitable[None]] | None = field(default=None, repr=False)
    _durable_steps: int = field(default=0, repr=False)  # trace steps already in a checkpoint
    _last_state: Any = field(default=None, repr=False)

    async def checkpoint(self, state: Any) -> None:
        """Make ``state`` (JSON-able) and the trace steps recorded so far durable.

        Returns once durable: on the durable path a worker killed right after this returns loses
        nothing; the retried agent step gets ``state`` back as :attr:`restored_state` and its
        trace with these steps. Work done after the last checkpoint (a model request, a tool
        call) may run again: it is at-least-once. Trace steps are final once checkpointed.
        Without a durable checkpointer (the direct executor) the checkpoint is kept in memory.
        """
        try:
            snapshot = json.loads(json.dumps(state))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"checkpoint state must be JSON-serializable: {exc}") from exc
        steps = self.trace.steps[self._durable_steps:]
        last_tool = next((s.extra.get("tool") for s in reversed(self.trace.steps)
                          if s.source == "tool" and s.extra.get("tool")), None)
        turn = snapshot.get("turn") if isinstance(snapshot, dict) else None
        if self._checkpointer is not None:
            await self._checkpointer(Checkpoint(
                state=snapshot, steps=[s.model_copy(deep=True) for s in steps],
                first_step=self._durable_steps, turn=turn if isinstance(turn, int) else None,
                last_tool=str(last_tool) if last_tool else None))
        self._durable_steps = len(self.trace.steps)
        self._last_state = snapshot
        self.checkpoints += 1

    @classmethod
    def for_step(cls, inp: AgentInput, client: EnvClient, trace: Trace,
                 checkpointer: Callable[[Checkpoint], Awaitable[None]] | None = None) -> Run:
        """The Run an agent receives in the agent step: the one builder of both executors, so an
        agent sees the same ids, ``group_index``, ``row_index`` and ``attempt`` in each."""
        return cls(task=inp.task, prompt=inp.prompt, bindings=list(client.bindings), client=client,
                   trace=trace, job_id=inp.job_id, group_id=inp.group_id, rollout_id=inp.rollout_id,
                   group_index=inp.group_index, row_index=inp.row_index, attempt=inp.retry + 1,
                   policy_version=inp.policy_version, policy_endpoint=inp.policy_endpoint,
                   _checkpointer=checkpointer)

    def _rewind(self, base: int) -> None:
        """Drop what came after the last checkpoint (or after the first ``base`` steps)."""
        del self.trace.steps[max(base, self._durable_steps):]
        self.restored_state = self._last_state

    def restore(self, checkpoint: Checkpoint | None) -> None:
        """Resume from ``checkpoint``: its steps become the trace, its state ``restored_state``."""
        if checkpoint is None:
            return
        self.trace.steps = [s.model_copy(deep=True) for s in checkpoint.steps]
        self._durable_steps = len(self.trace.steps)
        self.restored_state = self._last_state = checkpoint.state

    async def open(self, name: str) -> Any:
        """Open capability ``name`` through the run's client (see :meth:`EnvClient.open`).

        Opened handles are cached per client and closed when the agent step ends.
        """
        if self.client is None:
            raise InvalidStateError("run.open() needs a connected run (only while the agent runs)")
        return await self.client.open(name)

    async def close_capabilities(self) -> None:
        """Close every capability handle opened through :meth:`open`."""
        if self.client is not None:
            await self.client.close_capabilities()

    def __post_init__(self) -> None:
        if not self.slug and self.task is not None:
            self.slug = self.task.slug

    @property
    def reward(self) -> float | None:
        """The reward a trainer may use: the grade of a ``succeeded`` run, else None.

        Another status's best-effort grade stays in ``grade`` (see ``grade_reward``).
        """
        return self.grade_reward if self.status == "succeeded" else None

    @property
    def grade_reward(self) -> float | None:
        """The grade's reward whatever the status (None without a valid grade): for debugging."""
        if self.grade is None or self.grade.is_error:
            return None
        return self.grade.reward

    @property
    def counted(self) -> bool:
        """True when the run's reward enters statistics: it succeeded and was not dropped."""
        return self.reward is not None and not self.dropped

    @property
    def prompt_text(self) -> str:
        """The prompt as plain text (a string prompt, or the text of prompt messages)."""
        prompt = self.prompt.get("prompt", self.prompt) if isinstance(self.prompt, dict) else self.prompt
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list):
            parts = []
            for message in prompt:
                content = message.get("content") if isinstance(message, dict) else message
                if isinstance(content, list):  # content blocks: keep the text ones
                    content = "".join(
                        b.get("text", "") for b in content if isinstance(b, dict)
                    )
                parts.append(str(content))
            return "\n".join(parts)
        return json.dumps(prompt, default=str)

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        """The prompt as chat messages: a string prompt becomes one user message."""
        prompt = self.prompt.get("prompt", self.prompt) if isinstance(self.prompt, dict) else self.prompt
        if isinstance(prompt, list):
            return [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in prompt]
        return [{"role": "user", "content": self.prompt_text}]

    def record(self, step: Step) -> None:
        """Append ``step`` to the trace (HUD's ``run.record``; same as ``run.trace.record``)."""
        self.trace.record(step)

    def binding(self, name: str) -> dict[str, Any]:
        """A binding by name; through the client (tunnelled url) when connected."""
        if self.client is not None:
            return self.client.binding(name)
        for b in self.bindings:
            if b.get("name") == name:
                return b
        raise KeyError(f"no binding named {name!r}; have {[b.get('name') for b in self.bindings]}")

    @classmethod
    def from_result(cls, result: RolloutResult, trace: Trace | None = None,
                    task: Task | None = None, job_id: str = "") -> Run:
        """Rebuild a finished run from its compact result (and the trace, if loaded)."""
        return cls(
            task=task, trace=trace or Trace(trace_id=result.rollout_id), job_id=job_id,
            group_id=result.group_id, rollout_id=result.rollout_id, slug=result.slug,
            group_index=result.group_index, row_index=result.row_index, grade=result.grade,
            attempts=result.attempts, attempt=result.retries + 1, status=result.status,
            error=result.error,
            error_phase=result.error_phase, trace_ref=result.trace_ref, retries=result.retries,
            retry_history=list(result.retry_history), policy_version=result.policy_version,
        )

    def to_result(self) -> RolloutResult:
        """The compact, serializable outcome of this run."""
        status = self.status if self.status in (
            "succeeded", "errored", "failed", "cancelled", "timeout") else "errored"
        return RolloutResult(
            rollout_id=self.rollout_id, slug=self.slug, group_id=self.group_id,
            group_index=self.group_index, row_index=self.row_index, status=status,  # type: ignore[arg-type]
            reward=self.grade_reward, grade=self.grade, attempts=self.attempts, error=self.error,
            error_phase=self.error_phase, trace_ref=self.trace_ref, retries=self.retries,
            retry_history=list(self.retry_history), policy_version=self.policy_version,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (for ``export``): result fields plus task and trace."""
        out = self.to_result().model_dump(mode="json")
        out["reward"] = self.reward  # null unless succeeded; the grade stays under "grade"
        out["dropped"] = self.dropped
        out["job_id"] = self.job_id
        out["task"] = self.task.model_dump(mode="json") if self.task is not None else None
        out["prompt"] = self.prompt
        out["trace"] = self.trace.model_dump(mode="json")
        return out
