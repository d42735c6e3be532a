"""Map durable_rollouts errors to Temporal failures, at one edge (every activity uses it).

- ``ConfigError`` (a user mistake) -> non-retryable ``ApplicationError(type="ConfigError")``;
- ``SubstrateGoneError`` -> non-retryable ``ApplicationError(type="SubstrateGone")``: retrying the
  same step cannot help, the ``Rollout`` workflow reacts by reprovisioning;
- ``ModelAPIError`` -> ``ApplicationError(type="ModelAPIError")``: retryable ones (408/409/429/5xx,
  timeouts) with ``next_retry_delay`` = the server's ``Retry-After``, the rest non-retryable with
  the server's message;
- ``CheckpointError`` -> a retryable ``ApplicationError(type="CheckpointError")``;
- anything else is re-raised unchanged and retried with backoff (infrastructure);
- ``StepFailed`` (a part of a merged step failed) -> its cause mapped as above, always as an
  ``ApplicationError`` whose last detail is ``{"phase": <the part>}`` (``workflows.failures.failed_phase``).

Imports only temporalio, ``durable_rollouts.errors`` and the error type names of ``workflows.types``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from temporalio.exceptions import ApplicationError

from durable_rollouts.errors import (
    CheckpointError,
    ConfigError,
    ModelAPIError,
    StepFailed,
    SubstrateGoneError,
)
from durable_rollouts.workflows.types import ERR_CONFIG, ERR_SUBSTRATE_GONE

__all__ = [
    "CHECKPOINT_ERROR",
    "CONFIG_ERROR",
    "MODEL_API_ERROR",
    "SUBSTRATE_GONE",
    "map_errors",
    "map_step_errors",
]

CONFIG_ERROR = ERR_CONFIG
SUBSTRATE_GONE = ERR_SUBSTRATE_GONE
MODEL_API_ERROR = "ModelAPIError"
CHECKPOINT_ERROR = "CheckpointError"


@contextmanager
def map_errors() -> Iterator[None]:
    """Translate the package's permanent errors into typed Temporal application errors."""
    try:
        yield
    except ConfigError as err:
        raise ApplicationError(str(err) or type(err).__name__, type=CONFIG_ERROR,
                               non_retryable=True) from err
    except SubstrateGoneError as err:
        raise ApplicationError(str(err) or "substrate gone", type=SUBSTRATE_GONE,
                               non_retryable=True) from err
    except ModelAPIError as err:
        delay = (timedelta(seconds=err.retry_after_s)
                 if err.retryable and err.retry_after_s is not None else None)
        raise ApplicationError(str(err), {"status": err.status}, type=MODEL_API_ERROR,
                               non_retryable=not err.retryable, next_retry_delay=delay) from err
    except CheckpointError as err:
        raise ApplicationError(str(err), type=CHECKPOINT_ERROR) from err


@contextmanager
def map_step_errors() -> Iterator[None]:
    """``map_errors`` for a merged step: the failure also says which part of it failed."""
    try:
        yield
    except StepFailed as failed:
        phase = {"phase": failed.phase}
        try:
            with map_errors():
                raise failed.cause
        except ApplicationError as err:
            raise ApplicationError(err.message, *err.details, phase, type=err.type,
                                   non_retryable=err.non_retryable,
                                   next_retry_delay=err.next_retry_delay) from failed.cause
        except Exception as err:  # infrastructure: retryable, as temporalio would make it
            raise ApplicationError(str(err) or type(err).__name__, phase,
                                   type=type(err).__name__) from err
