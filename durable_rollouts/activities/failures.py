"""Map durable_rollouts errors to Temporal failures, at one edge (every activity uses it).

- ``ConfigError`` (a user mistake) -> non-retryable ``ApplicationError(type="ConfigError")``;
- ``SubstrateGoneError`` -> non-retryable ``ApplicationError(type="SubstrateGone")``: retrying the
  same step cannot help, the ``Rollout`` workflow reacts by reprovisioning;
- anything else is re-raised unchanged and retried with backoff (infrastructure).

Imports only temporalio, ``durable_rollouts.errors`` and the error type names of ``workflows.types``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError

from durable_rollouts.errors import ConfigError, SubstrateGoneError
from durable_rollouts.workflows.types import ERR_CONFIG, ERR_SUBSTRATE_GONE

__all__ = ["CONFIG_ERROR", "SUBSTRATE_GONE", "map_errors"]

CONFIG_ERROR = ERR_CONFIG
SUBSTRATE_GONE = ERR_SUBSTRATE_GONE


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
