"""How a Rollout run turns what its steps returned into a ``RolloutResult``, and publishes it.

Shared by the present shape (``rollout``) and the frozen earlier shapes (``legacy``): the
classification (same as the direct executor's, plus ``timeout``), the exceptions that end one
attempt, and the search attributes every Rollout carries. Adds no command of its own but the
search-attribute upserts its callers ask for. Deterministic: temporalio and the pure models only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.models import Grade, RolloutResult
    from durable_rollouts.step_io import AgentResult, graded_outcome
    from durable_rollouts.workflows.types import RolloutInput

__all__ = [
    "BEFORE_LAUNCH",
    "Errored",
    "KEY_STATUS",
    "SubstrateGone",
    "actor_raw",
    "final_attributes",
    "graded",
    "result",
    "run_attempts",
]

# Upserted by every Rollout: running (or set at its start by the parent), then its final status.
KEY_STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")
KEY_REWARD = SearchAttributeKey.for_float("RolloutsReward")
KEY_ERROR_PHASE = SearchAttributeKey.for_keyword("RolloutsErrorPhase")

BEFORE_LAUNCH = frozenset({"provisioning", "connecting", "starting task"})
"""Phases before the agent ran: a failure there is ``failed`` (nothing was attempted), else ``errored``."""


class SubstrateGone(Exception):
    """The substrate of this attempt is gone: tear down what is left and start a new attempt."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


class Errored(Exception):
    """This attempt ended in ``phase`` with an error that is the rollout's result."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


def actor_raw(grade: Grade, agent: AgentResult) -> dict[str, Any]:
    """What a verifier grades: the actor's grade frame, or a zero-score error frame (as steps.actor_result)."""
    if agent.error is None and not grade.is_error and grade.raw:
        return dict(grade.raw)
    return {"score": 0.0, "answer": agent.content, "content": agent.error or grade.content, "isError": True}


def result(inp: RolloutInput, status: str, *, error: str | None = None,
           error_phase: str | None = None, attempts: int = 1,
           started: float | None = None) -> RolloutResult:
    """A result of ``inp``'s rollout without a grade."""
    return RolloutResult(
        rollout_id=inp.rollout_id, slug=inp.task.slug, group_id=inp.group_id,
        group_index=inp.group_index, row_index=inp.row_index, status=status,  # type: ignore[arg-type]
        attempts=attempts, error=error, error_phase=error_phase, started_at=started,
        ended_at=workflow.time() if started is not None else None,
        policy_version=inp.policy.version if inp.policy is not None else None,
    )


def graded(inp: RolloutInput, agent: AgentResult, grade: Grade) -> RolloutResult:
    """The result of a graded rollout: succeeded, or why not (same as the direct executor)."""
    status, phase, error = graded_outcome(agent, grade)
    out = result(inp, status, error=error, error_phase=phase)
    out.grade = grade
    out.reward = None if grade.is_error else grade.reward
    out.trace_ref = agent.trace_ref
    return out


def final_attributes(out: RolloutResult) -> list[SearchAttributeUpdate[Any]]:
    """The search-attribute upserts of a finished rollout: status, reward (succeeded only), phase."""
    updates: list[SearchAttributeUpdate[Any]] = [KEY_STATUS.value_set(out.status)]
    if out.status == "succeeded" and out.reward is not None:
        updates.append(KEY_REWARD.value_set(out.reward))  # only real rewards
    if out.error_phase:
        updates.append(KEY_ERROR_PHASE.value_set(out.error_phase))
    return updates


async def run_attempts(inp: RolloutInput, attempt: Callable[[int], Awaitable[RolloutResult]],
                       last_phase: Callable[[], str],
                       admit: Callable[[int], AbstractAsyncContextManager[Any]] | None = None
                       ) -> RolloutResult:
    """Run rollout attempts until one has a result: a gone substrate starts the next attempt (up
    to ``inp.max_attempts``), and every lost attempt's error is kept in the result. The rollout
    timeout bounds each attempt (a durable timer): on expiry the running step is cancelled,
    teardown still runs, and the result is ``timeout`` in the phase ``last_phase()`` names.
    ``admit(number)``, when given, is held around each attempt, outside its timer (fleet-wide
    admission: a wait for it is not the rollout's time)."""
    started = workflow.time()
    errors: list[str] = []
    lost_in = "provisioning"
    for number in range(1, inp.max_attempts + 1):
        try:
            async with admit(number) if admit is not None else contextlib.nullcontext():
                out = await asyncio.wait_for(attempt(number), inp.rollout_timeout_s)
        except asyncio.TimeoutError:
            out = result(inp, "timeout", error=f"rollout timed out after {inp.rollout_timeout_s}s",
                         error_phase=last_phase())
        except SubstrateGone as gone:
            errors.append(f"attempt {number} ({gone.phase}): {gone}")
            lost_in = gone.phase
            workflow.logger.warning("rollout %s: substrate gone in %s: %s", inp.rollout_id, gone.phase, gone)
            continue
        out.attempts = number
        if errors:
            prior = "; ".join(errors)
            out.error = f"{out.error}; earlier: {prior}" if out.error else f"earlier: {prior}"
        out.started_at, out.ended_at = started, workflow.time()
        return out
    return result(inp, "errored", attempts=inp.max_attempts, started=started,
                  error=f"substrate gone {inp.max_attempts} times: " + "; ".join(errors), error_phase=lost_in)
