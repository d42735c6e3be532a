"""The Rollout's plan on Temporal: ``steps.plan`` mapped onto activity options.

The step list, its order, limits and attempts are plain data in ``steps.plan`` (``run_direct``
walks the same plan); here each step gets its activity name, ``timedelta`` limits and a
``RetryPolicy`` with the same backoff. "Local" steps run as local activities (a marker event with
the activity type in history) when the substrate is reachable from the workflow's own worker,
that is when the substrate's queue (``Endpoint.task_queue``) is the workflow's queue; otherwise
every step after provision runs as a regular activity on the substrate's queue (the provisioning
worker's host or process queue), with a schedule-to-start timeout: a queue nobody polls any more
means that worker, and the substrate with it, is gone. Deterministic and pure: imports
temporalio's common types, the plan data and the workflow input only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from durable_rollouts.steps import plan as card
from durable_rollouts.workflows.types import (
    ACT_AGENT,
    ACT_CONNECT,
    ACT_GRADE,
    ACT_PROVISION,
    ACT_START,
    ACT_TEARDOWN,
    ACT_VERIFY,
    ACT_VERIFY_CLOSE,
    ACT_VERIFY_OPEN,
    NON_RETRYABLE,
    RolloutInput,
)

__all__ = ["ACTIVITIES", "RolloutPlan", "StepOptions", "build_plan", "retry_policy"]

ACTIVITIES = {  # the card's step -> its activity type in history
    "provision": ACT_PROVISION, "connect": ACT_CONNECT, "start": ACT_START, "agent": ACT_AGENT,
    "grade": ACT_GRADE, "verify_open": ACT_VERIFY_OPEN, "verify": ACT_VERIFY,
    "verify_close": ACT_VERIFY_CLOSE, "teardown": ACT_TEARDOWN,
}


def retry_policy(attempts: int, max_interval_s: float = card.RETRY_MAX_S) -> RetryPolicy:
    """A step's retry policy: the plan's backoff (1 s, doubling, at most 30 s), ``attempts`` tries."""
    return RetryPolicy(initial_interval=timedelta(seconds=card.RETRY_FIRST_S),
                       backoff_coefficient=card.RETRY_BACKOFF,
                       maximum_interval=timedelta(seconds=max_interval_s),
                       maximum_attempts=attempts, non_retryable_error_types=NON_RETRYABLE)


@dataclass(frozen=True)
class StepOptions:
    """How one step runs as an activity: its type, timeouts, retries and locality."""

    step: str
    activity: str
    phase: str
    start_to_close: timedelta
    attempts: int
    heartbeat: timedelta | None = None
    local: bool = False  # a local activity when the substrate is reachable from this worker

    @property
    def retry(self) -> RetryPolicy:
        return retry_policy(self.attempts)

    @classmethod
    def of(cls, step: card.Step) -> StepOptions:
        return cls(step.step, ACTIVITIES[step.step], step.phase, timedelta(seconds=step.start_to_close_s),
                   step.attempts, None if step.heartbeat_s is None else timedelta(seconds=step.heartbeat_s),
                   step.local)


@dataclass(frozen=True)
class RolloutPlan(card.Walk[StepOptions]):
    """The plan's steps as activity options, and the substrate queue's schedule-to-start limit."""

    steps: tuple[StepOptions, ...]
    teardown: StepOptions
    queue_timeout: timedelta
    verifier: tuple[StepOptions, ...] = ()


def build_plan(inp: RolloutInput) -> RolloutPlan:
    """The plan of ``inp``'s rollout (``steps.plan.build_plan``) as activity options."""
    plan = card.build_plan(verifier=inp.task.verifier is not None,
                           rollout_timeout_s=inp.rollout_timeout_s, local_steps=inp.local_steps,
                           agent_heartbeat_s=inp.agent_heartbeat_s,
                           admitted=inp.admission is not None)
    return RolloutPlan(tuple(StepOptions.of(s) for s in plan.steps), StepOptions.of(plan.teardown),
                       timedelta(seconds=inp.queue_timeout_s),
                       tuple(StepOptions.of(s) for s in plan.verifier))
