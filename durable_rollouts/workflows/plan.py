"""The Rollout's plan: which steps run, in which order, with which options — one table.

Every Rollout runs the card's steps, ``provision -> connect -> start -> agent -> grade ->
[verify] -> teardown``, each a separately named activity in its history. :func:`build_plan`
reads its table once per run, from the task (a verifier adds its three steps) and the runtime
(a fast local substrate may provision and tear down as local activities, but never provisions
locally under fleet-wide admission); the workflow walks the result.

"Local" steps run as local activities (a marker event with the activity type in history) when
the substrate is reachable from the workflow's own worker, that is when the substrate's queue
(``Endpoint.task_queue``) is the workflow's queue; otherwise every step after provision runs
as a regular activity on the substrate's queue (the provisioning worker's host or process
queue), with a schedule-to-start timeout: a queue nobody polls any more means that worker, and
the substrate with it, is gone. Deterministic and pure: imports temporalio's common types and
the workflow input only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

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

__all__ = ["RolloutPlan", "StepOptions", "build_plan", "retry_policy"]

AGENT_TIMEOUT_SLACK = timedelta(minutes=1)  # over the rollout timeout: the workflow's timer fires first
AGENT_NO_TIMEOUT = timedelta(hours=24)


def retry_policy(attempts: int, max_interval_s: float = 30.0) -> RetryPolicy:
    """A step's retry policy: 1 s, doubling, at most ``max_interval_s`` apart, ``attempts`` tries."""
    return RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                       maximum_interval=timedelta(seconds=max_interval_s),
                       maximum_attempts=attempts, non_retryable_error_types=NON_RETRYABLE)


@dataclass(frozen=True)
class StepOptions:
    """How one step runs: its activity, timeouts, retries and whether it may run locally."""

    step: str  # the card's name: provision, connect, start, agent, grade, verify..., teardown
    activity: str
    phase: str  # what the ``phase`` query and ``error_phase`` call it
    start_to_close: timedelta
    attempts: int
    heartbeat: timedelta | None = None
    local: bool = False  # a local activity when the substrate is reachable from this worker

    @property
    def retry(self) -> RetryPolicy:
        return retry_policy(self.attempts)


@dataclass(frozen=True)
class RolloutPlan:
    """The steps of one Rollout, in order, and the options they share."""

    steps: tuple[StepOptions, ...]  # walked in order: provision .. grade, then verify if any
    teardown: StepOptions  # runs last on every path, also after a failure or cancellation
    queue_timeout: timedelta  # schedule-to-start on the substrate's queue
    verifier: tuple[StepOptions, ...] = ()  # verify_open and verify_close, around verify

    def __getitem__(self, step: str) -> StepOptions:
        for options in (*self.steps, *self.verifier, self.teardown):
            if options.step == step:
                return options
        raise KeyError(step)

    @property
    def names(self) -> list[str]:
        """The steps' names in the order a successful run records them."""
        walked = [s.step for s in self.steps]
        if self.verifier:
            walked[-1:] = ["verify_open", "verify", "verify_close"]
        return [*walked, self.teardown.step]


def build_plan(inp: RolloutInput) -> RolloutPlan:
    """The plan of ``inp``'s rollout: the card's steps, a verifier's if its task has one."""
    fast = inp.local_steps
    agent_limit = (timedelta(seconds=inp.rollout_timeout_s) + AGENT_TIMEOUT_SLACK
                   if inp.rollout_timeout_s else AGENT_NO_TIMEOUT)
    minutes, seconds = (lambda n: timedelta(minutes=n)), (lambda n: timedelta(seconds=n))
    steps = [  # step, activity, phase, start-to-close, attempts, heartbeat, local when reachable
        # admitted provisions are regular activities: their start times are the server's
        StepOptions("provision", ACT_PROVISION, "provisioning", minutes(10), 5, seconds(10),
                    fast and inp.admission is None),
        StepOptions("connect", ACT_CONNECT, "connecting", minutes(2), 3, None, True),
        StepOptions("start", ACT_START, "starting task", minutes(2), 5, None, True),
        StepOptions("agent", ACT_AGENT, "agent loop", agent_limit, 5, seconds(5), False),
        StepOptions("grade", ACT_GRADE, "grading", minutes(30), 5, seconds(10), True),
    ]
    verifier: tuple[StepOptions, ...] = ()
    if inp.task.verifier is not None:
        steps.append(StepOptions("verify", ACT_VERIFY, "verifying", minutes(30), 5, seconds(10)))
        verifier = (
            StepOptions("verify_open", ACT_VERIFY_OPEN, "verifying", minutes(10), 5, seconds(10)),
            StepOptions("verify_close", ACT_VERIFY_CLOSE, "verifying", minutes(2), 10),
        )
    teardown = StepOptions("teardown", ACT_TEARDOWN, "teardown", minutes(2), 10, None, fast)
    return RolloutPlan(tuple(steps), teardown, timedelta(seconds=inp.queue_timeout_s), verifier)
