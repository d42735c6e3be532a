"""Drive one task's async generator: prompt, grade (exactly once), teardown.

A :class:`TaskRunner` belongs to one session. ``start`` advances the generator to its first
``yield`` (the prompt), ``grade`` sends the answer in and normalises the second ``yield``, then
closes the generator so its ``finally`` blocks (the task's teardown) run. The grade outcome, a
frame or an error, is cached: a repeated grade returns it again and never re-runs task code.

Imports only ``environment.py`` and the shared errors/protocol modules; no sockets here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from enum import Enum
from typing import Any

from ..errors import InvalidStateError, RemoteTaskError
from ..protocol import ErrorCode
from .environment import Template, normalize_grade

__all__ = ["RunnerState", "TaskRunner"]

log = logging.getLogger(__name__)


class RunnerState(Enum):
    NEW = "new"
    STARTED = "started"
    GRADED = "graded"
    CLOSED = "closed"


class TaskRunner:
    """One task instance inside one session.

    Args:
        template: the template to run.
        args: arguments already validated by :meth:`Template.bind_arguments`.
    """

    def __init__(self, template: Template, args: dict[str, Any]) -> None:
        self.template = template
        self.args = args
        self.state = RunnerState.NEW
        self._gen: AsyncGenerator[Any, Any] | None = None
        self._lock = asyncio.Lock()
        self._result: dict[str, Any] | None = None
        self._error: RemoteTaskError | None = None
        self.prompt: dict[str, Any] | None = None  # the prompt frame, once started

    @property
    def task_id(self) -> str:
        return self.template.id

    async def start(self) -> dict[str, Any]:
        """Run the task body up to its first ``yield`` and return the prompt frame.

        Raises:
            RemoteTaskError: the body raised or ended before yielding a prompt.
        """
        async with self._lock:
            if self.state is not RunnerState.NEW:
                raise InvalidStateError(f"task {self.task_id!r} already started")
            self._gen = self.template.make_generator(self.args)
            self.state = RunnerState.STARTED
            try:
                first = await self._gen.__anext__()
            except StopAsyncIteration:
                await self._close_locked()
                raise RemoteTaskError(ErrorCode.TASK_ERROR, f"task {self.task_id!r} yielded no prompt") from None
            except Exception as exc:
                await self._close_locked()
                raise RemoteTaskError(ErrorCode.TASK_ERROR, f"task {self.task_id!r} raised: {exc!r}") from exc
            self.prompt = dict(first) if isinstance(first, dict) and "prompt" in first else {"prompt": first}
            return dict(self.prompt)

    async def grade(self, answer: Any) -> tuple[dict[str, Any], bool]:
        """Send the answer in and return ``(score frame, ran)``; ``ran`` is False for a replay.

        Raises:
            RemoteTaskError: the body raised or yielded something that is not a grade (cached too).
        """
        async with self._lock:
            if self.state is RunnerState.GRADED or self.state is RunnerState.CLOSED and self._done:
                return self._replay(), False
            if self.state is not RunnerState.STARTED or self._gen is None:
                raise InvalidStateError(f"task {self.task_id!r} is not waiting for an answer")
            try:
                value = await self._gen.asend(self.template.wrap_answer(answer))
                self._result = normalize_grade(value)
            except StopAsyncIteration:
                self._result = {"score": 0.0}
            except Exception as exc:
                self._error = RemoteTaskError(
                    ErrorCode.TASK_ERROR, f"task {self.task_id!r} failed to grade: {exc!r}"
                )
            self.state = RunnerState.GRADED
            await self._close_locked(keep_state=True)
            return self._replay(), True

    @property
    def _done(self) -> bool:
        return self._result is not None or self._error is not None

    @property
    def graded(self) -> bool:
        return self._done

    @property
    def in_progress(self) -> bool:
        """True from install until graded or closed: the task body may hold resources."""
        return self.state is RunnerState.NEW or self.state is RunnerState.STARTED

    def _replay(self) -> dict[str, Any]:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return dict(self._result)

    async def close(self) -> None:
        """Close the generator (runs its teardown); idempotent, never raises."""
        async with self._lock:
            await self._close_locked()

    async def _close_locked(self, keep_state: bool = False) -> None:
        gen, self._gen = self._gen, None
        if not keep_state:
            self.state = RunnerState.CLOSED
        if gen is None:
            return
        try:
            await gen.aclose()
        except Exception:
            log.exception("teardown of task %r failed", self.task_id)
