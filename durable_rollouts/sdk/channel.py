"""A rollout step's connection to a substrate's control channel: open, resume, start, grade, end.

Every step after ``connect`` reconnects with ``hello{session_id}``, so each may run in a fresh
process. Connection failures are classified here, at the edge: a substrate that refuses
connections, never answers or forgot the session is :class:`SubstrateGoneError` (the rollout
reprovisions); a refused ``tasks.start`` for bad arguments is a :class:`ConfigError`; a refused
or failed grade is a graded error, not a retry. Shared by ``steps``, ``agent_step``,
``merged_steps`` and the verifier steps. Imports models, errors, protocol codes, the client and
token helpers; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, NoReturn

from ..errors import (
    ConfigError,
    ProtocolError,
    ReadyTimeoutError,
    RemoteTaskError,
    SubstrateGoneError,
    UnauthorizedError,
)
from ..models import Endpoint, Grade, Session, Task
from ..protocol import ErrorCode
from .client import EnvClient
from .client import connect as _open
from .tokens import endpoint_token, token_rejected, uses_derived_token

__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "REFUSED_LIMIT",
    "RESUME_TIMEOUT_S",
    "end_in",
    "end_session",
    "failed_raw",
    "fresh",
    "grade_failure",
    "grade_in",
    "raise_start_error",
    "ready_timeout",
    "resume",
    "session_of",
    "start_task",
    "to_grade",
]

DEFAULT_READY_TIMEOUT_S = 60.0
RESUME_TIMEOUT_S = 30.0
_RESUME_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # a just-closed session may not be parked yet
REFUSED_LIMIT = 3  # refusals in a row (0.1 s, 0.2 s apart) before a resumed substrate counts as gone


def ready_timeout(endpoint: Endpoint, override: float | None = None) -> float:
    """How long a fresh substrate may take to answer: override, endpoint param, limits, default."""
    if override:
        return override
    if endpoint.params.get("ready_timeout"):
        return float(endpoint.params["ready_timeout"])
    limits = endpoint.config.limits if endpoint.config is not None else None
    if limits is not None and limits.startup_timeout_s:
        return limits.startup_timeout_s
    return DEFAULT_READY_TIMEOUT_S


async def _hello(endpoint: Endpoint, timeout: float, session_id: str | None = None,
                 refused_limit: int | None = None) -> EnvClient:
    """Connect with the endpoint's token (derived again from its key: never stored in history).

    ``refused_limit``: for a server that was already up, a port refused that many times in a row
    (about 0.3 s for 3) is a gone substrate, while a slow one (a busy env loop) still gets the whole
    ``timeout``; None retries refusals too (a just-provisioned server may not listen yet).
    """
    try:
        return await _open(endpoint.url, ready_timeout=timeout, session_id=session_id,
                           token=endpoint_token(endpoint), refused_limit=refused_limit)
    except (ConnectionRefusedError, ConnectionResetError) as exc:  # only with a refused_limit
        raise SubstrateGoneError(f"substrate at {endpoint.url} refuses connections: {exc}") from exc
    except UnauthorizedError as exc:
        if not uses_derived_token(endpoint):
            raise
        raise token_rejected(exc, endpoint.url) from exc


async def fresh(endpoint: Endpoint, timeout: float, refused_limit: int | None = None) -> EnvClient:
    """A new session; a substrate that never answers (or refuses, see ``_hello``) is gone."""
    try:
        return await _hello(endpoint, timeout, refused_limit=refused_limit)
    except ReadyTimeoutError as exc:
        raise SubstrateGoneError(f"substrate at {endpoint.url} did not answer: {exc}") from exc


async def resume(endpoint: Endpoint, session: Session, timeout: float | None = None) -> EnvClient:
    """Reconnect to ``session``; refused or unknown session -> SubstrateGoneError.

    A refused port is reported gone after ``REFUSED_LIMIT`` refusals (``_hello``), while a slow
    substrate (a busy env loop) gets the whole resume timeout.
    """
    timeout = timeout or float(endpoint.params.get("resume_timeout", RESUME_TIMEOUT_S))
    last: ProtocolError | None = None
    for delay in (*_RESUME_BACKOFF_S, None):
        try:
            return await _hello(endpoint, timeout, session.session_id, refused_limit=REFUSED_LIMIT)
        except ReadyTimeoutError as exc:
            raise SubstrateGoneError(f"substrate at {endpoint.url} is gone: {exc}") from exc
        except ProtocolError as exc:
            if exc.code != ErrorCode.INVALID_REQUEST:
                raise
            last = exc
        if delay is not None:
            await asyncio.sleep(delay)
    raise SubstrateGoneError(
        f"session {session.session_id} is unknown at {endpoint.url} (the environment restarted or "
        f"the session expired): {last.message if last else ''}"
    )


def session_of(client: EnvClient) -> Session:
    """The session ``client`` speaks for, as recorded in history."""
    return Session(session_id=client.session_id, env_name=client.env.name,
                   env_version=client.env.version, bindings=list(client.bindings))


def raise_start_error(exc: ProtocolError, task: Task) -> NoReturn:
    """Re-raise a refused ``tasks.start``: bad arguments are a ConfigError (final), the rest as is."""
    if exc.code == ErrorCode.INVALID_PARAMS:
        raise ConfigError(f"task {task.id!r} of env {task.env!r} was rejected: {exc.message}") from exc
    raise exc


async def start_task(client: EnvClient, task: Task) -> dict[str, Any]:
    """``tasks.start`` of ``task`` on ``client``; returns the prompt frame."""
    try:
        return await client.start_task(task.id, dict(task.args))
    except ProtocolError as exc:
        raise_start_error(exc, task)


def failed_raw(answer: str | None, content: str | None) -> dict[str, Any]:
    """The zero-score error frame a failed grade (or a failed actor, for a verifier) stands for."""
    return {"score": 0.0, "answer": answer, "content": content, "isError": True}


def grade_failure(exc: ProtocolError, agent_error: str | None) -> str:
    """The message of a grade the env refused or raised in."""
    what = "grading raised in the environment" if isinstance(exc, RemoteTaskError) else "grading was refused"
    suffix = f" (agent error: {agent_error})" if agent_error else ""
    return f"{what}: {exc.message}{suffix}"


def to_grade(frame: Any) -> Grade:
    """A ``tasks.grade`` result as a Grade; a frame without a numeric score is a graded error."""
    if not isinstance(frame, dict):
        return Grade.error(f"grade frame is not an object: {frame!r}")
    try:
        return Grade.from_frame(frame)
    except ValueError as exc:
        return Grade.error(str(exc), raw=frame)


async def grade_in(client: EnvClient, answer: str | None, agent_error: str | None = None) -> Grade:
    """Grade the session's task with ``answer``; a refusal or a raising grader is a graded error."""
    try:
        frame = await client.grade(answer)
    except ProtocolError as exc:  # the env refused or the task raised: a result, not a retry
        return Grade.error(grade_failure(exc, agent_error),
                           raw=failed_raw(answer, agent_error or exc.message))
    return to_grade(frame)


async def end_in(client: EnvClient) -> None:
    """End the session: ``bye`` also tears its task down (no ``tasks.cancel`` round trip first)."""
    with contextlib.suppress(ProtocolError):
        await client.bye()


async def end_session(endpoint: Endpoint, session: Session) -> None:
    """Resume ``session`` briefly and end it."""
    client = await resume(endpoint, session, timeout=1.0)
    try:
        await end_in(client)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
