"""Temporal's client errors as one readable line (the CLI's edge for them).

``TEMPORAL_ERRORS`` is what a command catches; ``temporal_error_line`` says what went wrong.
"""

from __future__ import annotations

from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

__all__ = ["TEMPORAL_ERRORS", "temporal_error_line"]

TEMPORAL_ERRORS: tuple[type[BaseException], ...] = (RPCError, WorkflowFailureError)


def temporal_error_line(exc: BaseException) -> str:
    """``Temporal refused the request: ...`` / ``the batch workflow failed: ...``."""
    if isinstance(exc, RPCError):
        return f"Temporal refused the request: {exc.message or exc}"
    if isinstance(exc, WorkflowFailureError):
        return f"the batch workflow failed: {exc.cause or exc}"
    return f"{type(exc).__name__}: {exc}"
