"""The one exception tree of durable_rollouts.

Every error this package raises on purpose derives from :class:`DurableRolloutsError`::

    DurableRolloutsError
    ├── ConfigError            a user mistake: bad task, bad args, bad agent/runtime spec (never retried)
    │   └── TaskNotFoundError  a task id that the environment does not define
    ├── ProtocolError          the control channel said no (carries the JSON-RPC code)
    │   ├── UnauthorizedError  wrong or missing token (-32001)
    │   ├── RemoteTaskError    the task body raised inside the environment (-32000)
    │   └── ServerBusyError    the server is at its connection or task limit (-32002; transient)
    ├── InvalidStateError      an operation in the wrong session/connection state
    ├── ConnectionLostError    the channel dropped mid-call (retryable infrastructure)
    ├── SubstrateGoneError     the substrate behind an endpoint is gone: reprovision
    │   └── SessionGoneError   it answers, but no longer knows the session (restarted, expired)
    ├── ProviderError          a provider could not place or remove an environment
    ├── EnvError               the environment itself failed (hook raised, capability never came up)
    ├── ModelAPIError          the model endpoint failed (retryable: 408/409/429/5xx, timeouts)
    ├── CheckpointError        an agent checkpoint could not be made durable (retryable)
    └── ReadyTimeoutError      the substrate never answered `hello` in time (also a TimeoutError)

Activities map these to Temporal failures at one edge (``durable_rollouts.activities.failures``):
``ConfigError`` becomes a non-retryable ``ApplicationError``, ``SubstrateGoneError`` a typed one the
``Rollout`` workflow reacts to by reprovisioning, ``ModelAPIError`` a typed one retried after the
server's ``Retry-After`` (or never, for a refused request), everything else is retried with backoff.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ConnectionLostError",
    "DurableRolloutsError",
    "EnvError",
    "InvalidStateError",
    "ModelAPIError",
    "ProtocolError",
    "ProviderError",
    "ReadyTimeoutError",
    "RemoteTaskError",
    "ServerBusyError",
    "SessionGoneError",
    "StepFailed",
    "SubstrateGoneError",
    "TaskNotFoundError",
    "UnauthorizedError",
]


class DurableRolloutsError(Exception):
    """Root of every error raised on purpose by durable_rollouts."""


class ConfigError(DurableRolloutsError, ValueError):
    """A user mistake that no retry can fix (bad task, args, agent or runtime spec)."""


class TaskNotFoundError(ConfigError, KeyError):
    """The environment defines no task with this id."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown task"


class ProtocolError(DurableRolloutsError):
    """An error frame from the control channel, or a frame that breaks the protocol.

    Args:
        code: the JSON-RPC error code.
        message: the human-readable message from the frame.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class UnauthorizedError(ProtocolError):
    """The server rejected the token (-32001)."""


class RemoteTaskError(ProtocolError):
    """The task body raised inside the environment (-32000)."""


class ServerBusyError(ProtocolError):
    """The server is at its connection or task limit (-32002); transient, so retried with backoff."""


class InvalidStateError(DurableRolloutsError, RuntimeError):
    """An operation was attempted in a state that does not allow it."""


class ConnectionLostError(DurableRolloutsError, ConnectionError):
    """The control channel closed or broke in the middle of a call."""


class SubstrateGoneError(DurableRolloutsError):
    """The substrate behind an endpoint no longer exists (refused, or its session is unknown)."""


class SessionGoneError(SubstrateGoneError):
    """The substrate answers but does not know the session any more (it restarted, the session
    expired, or — on a HUD v6 server — the session was graded or had no task when its connection
    closed)."""


class StepFailed(DurableRolloutsError):
    """One part of a merged step (e.g. ``connecting`` inside provision -> connect -> start) failed.

    ``phase`` names the part; ``cause`` (also ``__cause__``) is the error it raised.
    """

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.phase = phase
        self.cause = cause


class ProviderError(DurableRolloutsError):
    """A provider failed to place, reach or remove an environment."""


class EnvError(DurableRolloutsError):
    """The environment failed on its own side (a hook raised, a capability never came up)."""


class ModelAPIError(DurableRolloutsError):
    """The model endpoint failed a request.

    Args:
        message: what the server said (never the request headers: no API key in here).
        retryable: True for 408/409/429/5xx and timeouts (the agent step is retried and resumes
            from its last checkpoint); False for 400/401/403/404 (retrying cannot help).
        retry_after_s: the server's ``Retry-After``, when it sent one.
        status: the HTTP status, or None for a transport failure / timeout.
    """

    def __init__(self, message: str, *, retryable: bool, retry_after_s: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.status = status


class CheckpointError(DurableRolloutsError):
    """``Run.checkpoint`` could not be made durable (the workflow refused it or is unreachable).

    Not the agent's failure: the agent step fails and is retried from the last checkpoint (a
    superseded, zombie attempt stops here)."""


class ReadyTimeoutError(DurableRolloutsError, TimeoutError):
    """The substrate did not answer ``hello`` before the ready timeout."""
