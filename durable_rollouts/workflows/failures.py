"""How the ``Rollout`` workflow reads a failed step: pure functions over temporalio's exceptions.

Deterministic (no I/O, no clock): imports only temporalio and ``workflows.types``' error names.
A failed step raises ``ActivityError(cause=...)``; a failed local activity may raise its cause.
"""

from __future__ import annotations

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError as TemporalCancelledError,
    TimeoutError as TemporalTimeoutError,
    TimeoutType,
)

from durable_rollouts.workflows.types import ERR_CONFIG, ERR_SUBSTRATE_GONE

__all__ = [
    "STEP_FAILURES",
    "cause_of",
    "failed_phase",
    "failure_message",
    "is_cancelled",
    "is_config_error",
    "is_heartbeat_timeout",
    "is_queue_lost",
    "is_substrate_gone",
    "is_timeout",
]

# A failed step raises ActivityError(cause=...); a failed *local* activity may raise its cause directly.
STEP_FAILURES = (ActivityError, ApplicationError, TemporalTimeoutError)


def cause_of(err: BaseException) -> BaseException | None:
    return err.cause if isinstance(err, ActivityError) else err


def is_cancelled(err: BaseException) -> bool:
    return isinstance(cause_of(err), TemporalCancelledError)


def is_substrate_gone(err: BaseException) -> bool:
    """True for a failure that means the substrate is gone and the rollout must reprovision."""
    cause = cause_of(err)
    if isinstance(cause, ApplicationError) and cause.type == ERR_SUBSTRATE_GONE:
        return True
    # A pinned (host/process) queue that nobody polls: its worker, and likely its substrate, died.
    return is_queue_lost(err)


def is_queue_lost(err: BaseException) -> bool:
    """True when a step on a substrate's own queue was never picked up: its worker is gone."""
    cause = cause_of(err)
    return isinstance(cause, TemporalTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def is_config_error(err: BaseException) -> bool:
    cause = cause_of(err)
    return isinstance(cause, ApplicationError) and cause.type == ERR_CONFIG


def is_timeout(err: BaseException) -> bool:
    return isinstance(cause_of(err), TemporalTimeoutError)


def is_heartbeat_timeout(err: BaseException) -> bool:
    cause = cause_of(err)
    return isinstance(cause, TemporalTimeoutError) and cause.type == TimeoutType.HEARTBEAT


def failure_message(err: BaseException) -> str:
    cause = cause_of(err) or err
    if isinstance(cause, ApplicationError) and cause.type:
        return f"{cause.type}: {cause.message}"
    if isinstance(cause, TemporalTimeoutError):
        return f"{cause.type.name if cause.type else 'TIMEOUT'} timeout" + (
            f" ({failure_message(cause.cause)})" if cause.cause else "")
    return str(cause) or type(cause).__name__


def failed_phase(err: BaseException, default: str) -> str:
    """The part of a merged step that failed (its failure's ``{"phase": ...}`` detail), else ``default``."""
    cause = cause_of(err)
    if isinstance(cause, ApplicationError):
        for detail in reversed(cause.details):
            if isinstance(detail, dict) and isinstance(detail.get("phase"), str):
                return detail["phase"]
    return default
