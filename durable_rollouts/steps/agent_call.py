"""Calling an agent once per agent step: its own failures recorded, model API errors resumed.

``call_agent`` is the agent step's one call into user code (``steps.execute_agent``). An agent's
exception is its own failure: recorded in the trace, and the rollout is still graded. A retryable
``ModelAPIError`` is infrastructure: on the durable path it ends the step (Temporal retries it
after ``Retry-After`` and the retry resumes from the last checkpoint); in-process (the direct
executor) it is retried here the same way. Imports errors and models only; the agent and its run are duck-typed (``AgentLike``, ``RunLike``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from ..backoff import delays
from ..errors import CheckpointError, ModelAPIError
from ..models import Step, Trace

__all__ = ["AgentLike", "RunLike", "call_agent", "record_failure"]


class RunLike(Protocol):
    """What the agent step needs of a ``Run`` (``sdk.run.Run``)."""

    trace: Trace
    client: Any
    restored_state: Any

    def restore(self, checkpoint: Any) -> None: ...
    def _rewind(self, steps: int) -> None: ...
    async def close_capabilities(self) -> None: ...


class AgentLike(Protocol):
    """What the agent step needs of an agent (``sdk.agents.Agent``): a timeout and a call."""

    timeout_s: float | None

    async def __call__(self, run: Any) -> None: ...

_LOCAL_MODEL_RETRIES = 3  # without a durable checkpointer (direct executor): retries in-process


async def call_agent(agent: AgentLike, run: RunLike, *, durable: bool) -> None:
    """``agent(run)``; its own failures are recorded in the trace (still graded).

    A retryable ``ModelAPIError`` ends the step on the durable path (the step is retried and
    resumes from the last checkpoint); in-process it is retried here the same way, from the last
    checkpoint, a few times. A ``CheckpointError`` is infrastructure: it always raises.
    """
    base = len(run.trace.steps)
    pauses = delays(1.0)
    for attempt in range(_LOCAL_MODEL_RETRIES + 1):
        try:
            await agent(run)
            return
        except asyncio.CancelledError:
            raise
        except CheckpointError:
            raise
        except ModelAPIError as exc:
            if exc.retryable and durable:
                raise
            if exc.retryable and attempt < _LOCAL_MODEL_RETRIES:
                pause = next(pauses)
                await asyncio.sleep(exc.retry_after_s if exc.retry_after_s is not None else pause)
                run._rewind(base)  # back to the last checkpoint, as a retried step would be
                continue
            record_failure(run.trace, exc)
            return
        except Exception as exc:  # the agent's own failure: recorded, still graded
            record_failure(run.trace, exc)
            return


def record_failure(trace: Trace, exc: BaseException) -> None:
    trace.status = "error"
    trace.stop_reason = "error"
    trace.record(Step(source="system", error=f"{type(exc).__name__}: {exc}", ended_at=time.time()))
