"""``Run``: what an agent receives while it works, and what a ``Job`` keeps afterwards.

During the agent step a Run carries the live control-channel client; once the rollout is over
the same object holds the grade, status and trace. Imports models only (the client type is for
type checking).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InvalidStateError
from ..models import Grade, RetryAttempt, RolloutResult, Task, Trace, TraceRef

if TYPE_CHECKING:
    from .client import EnvClient

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
        retries: fresh re-runs the batch gave it (``retry_history``: the earlier outcomes).
        dropped: its group had an unrecovered error under ``on_error="drop_group"``: it is
            exported with ``dropped: true`` and left out of every statistic.
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
    status: str = "running"
    error: str | None = None
    error_phase: str | None = None
    trace_ref: TraceRef | None = None
    retries: int = 0
    retry_history: list[RetryAttempt] = field(default_factory=list)
    dropped: bool = False
    _opened: dict[str, Any] = field(default_factory=dict, repr=False)

    async def open(self, name: str) -> Any:
        """Open capability ``name`` (an asyncssh connection for ssh, a fastmcp Client for mcp).

        Opened handles are cached per run and closed when the agent step ends.
        """
        if self.client is None:
            raise InvalidStateError("run.open() needs a connected run (only while the agent runs)")
        if name not in self._opened:
            from .capabilities import open_capability

            self._opened[name] = await open_capability(self.client, name)
        return self._opened[name]

    async def close_capabilities(self) -> None:
        """Close every capability handle opened through :meth:`open`."""
        from .capabilities import close_capability

        opened, self._opened = self._opened, {}
        for handle in opened.values():
            await close_capability(handle)

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
            attempts=result.attempts, status=result.status, error=result.error,
            error_phase=result.error_phase, trace_ref=result.trace_ref, retries=result.retries,
            retry_history=list(result.retry_history),
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
            retry_history=list(self.retry_history),
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
