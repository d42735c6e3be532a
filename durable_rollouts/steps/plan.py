"""The Rollout's plan as plain data: which steps run, in which order, with which limits.

Every rollout runs the card's steps, ``provision -> connect -> start -> agent -> grade ->
[verify_open, verify, verify_close] -> teardown``. :func:`build_plan` reads one table, once per
rollout, from whether the task has a verifier, the rollout's timeout and whether the substrate is
fast enough for local steps. Both executors walk the result: the ``Rollout`` workflow maps each
step onto an activity (``workflows.plan``), ``run_direct`` calls the same step functions in plain
asyncio (``sdk.direct``); both retry a step the same way (:func:`retry_delay`). Pure: standard
library only, so the workflow sandbox imports it as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "AGENT_HEARTBEAT_S",
    "AGENT_NO_TIMEOUT_S",
    "AGENT_TIMEOUT_SLACK_S",
    "Plan",
    "RETRY_BACKOFF",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "Step",
    "Walk",
    "build_plan",
    "retry_delay",
]

AGENT_TIMEOUT_SLACK_S = 60.0  # over the rollout timeout: the rollout's own timer fires first
AGENT_NO_TIMEOUT_S = 24 * 3600.0
AGENT_HEARTBEAT_S = 20.0
"""The agent step's heartbeat timeout when nothing else is said (histories from before the worker
watch; ``ROLLOUTS_WORKER_WATCH=0``): a dead worker's agent step is retried within it, and a
waiting agent costs the server one write per 16 s. With the watch on, batches set a long one."""
RETRY_FIRST_S = 1.0  # a failed attempt waits 1 s, then twice as long each time, at most 30 s
RETRY_BACKOFF = 2.0
RETRY_MAX_S = 30.0
S = TypeVar("S")


@dataclass(frozen=True)
class Step:
    """One step of the plan: its card name, phase, limit, attempts, heartbeat and locality."""

    step: str  # the card's name: provision, connect, start, agent, grade, verify..., teardown
    phase: str  # what the ``phase`` query, ``error_phase`` and ``rollouts show`` call it
    start_to_close_s: float  # one attempt's limit
    attempts: int  # attempts in all (1 = no retry)
    heartbeat_s: float | None = None  # a durable step beats within this (None: no heartbeat)
    local: bool = False  # may run beside the rollout's own code when the substrate is reachable


class Walk(Generic[S]):
    """Looking a plan's steps up by name, and the order a successful rollout records them."""

    steps: tuple[S, ...]
    teardown: S
    verifier: tuple[S, ...]

    def __getitem__(self, step: str) -> S:
        for options in (*self.steps, *self.verifier, self.teardown):
            if options.step == step:  # type: ignore[attr-defined]
                return options
        raise KeyError(step)

    @property
    def names(self) -> list[str]:
        """The steps' names in the order a successful rollout records them."""
        walked = [s.step for s in self.steps]  # type: ignore[attr-defined]
        if self.verifier:
            walked[-1:] = ["verify_open", "verify", "verify_close"]
        return [*walked, self.teardown.step]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Plan(Walk[Step]):
    """The steps of one rollout, in order, and the teardown that ends every path."""

    steps: tuple[Step, ...]  # walked in order: provision .. grade, then verify if any
    teardown: Step  # runs last on every path, also after a failure or cancellation
    verifier: tuple[Step, ...] = ()  # verify_open and verify_close, around verify



def build_plan(*, verifier: bool, rollout_timeout_s: float | None, local_steps: bool,
               agent_heartbeat_s: float = AGENT_HEARTBEAT_S, admitted: bool = False) -> Plan:
    """The plan of one rollout: the card's steps, and a verifier's when its task has one.

    ``local_steps``: the substrate is fast to place and tear down (in-process), so provision and
    teardown may run locally too, except provision under fleet-wide admission (``admitted``: its
    start times must be the server's). ``agent_heartbeat_s``: the agent step's heartbeat timeout
    (temporalio sends one heartbeat per 80% of it, so a waiting agent costs the server one write
    per that much time).
    """
    agent_s = rollout_timeout_s + AGENT_TIMEOUT_SLACK_S if rollout_timeout_s else AGENT_NO_TIMEOUT_S
    fast, minute = local_steps, 60.0
    steps = [  # step, phase, start-to-close, attempts, heartbeat, local when reachable
        Step("provision", "provisioning", 10 * minute, 5, 10.0, fast and not admitted),
        Step("connect", "connecting", 2 * minute, 3, None, True),
        Step("start", "starting task", 2 * minute, 5, None, True),
        Step("agent", "agent loop", agent_s, 5, agent_heartbeat_s, False),
        Step("grade", "grading", 30 * minute, 5, 10.0, True),
    ]
    extra: tuple[Step, ...] = ()
    if verifier:
        steps.append(Step("verify", "verifying", 30 * minute, 5, 10.0))
        extra = (Step("verify_open", "verifying", 10 * minute, 5, 10.0),
                 Step("verify_close", "verifying", 2 * minute, 10))
    teardown = Step("teardown", "teardown", 2 * minute, 10, None, fast)
    return Plan(tuple(steps), teardown, extra)


def retry_delay(failed_attempts: int) -> float:
    """The pause before the next attempt after ``failed_attempts`` (>= 1) failed ones."""
    return min(RETRY_FIRST_S * RETRY_BACKOFF ** (failed_attempts - 1), RETRY_MAX_S)
