"""A rollout step's connection to a substrate's control channel: open, resume, start, grade, end.

Every step after ``connect`` reconnects with ``hello{session_id}``, so each may run in a fresh
process. Connection failures are classified here, at the edge: a substrate that refuses
connections, never answers or forgot the session is :class:`SubstrateGoneError` (the rollout
reprovisions); a refused ``tasks.start`` for bad arguments is a :class:`ConfigError`; a refused
or failed grade is a graded error, not a retry. Shared by the steps (``steps/``) and the frozen
merged steps (``activities/legacy_steps``). Imports models, errors, protocol codes, the client
and token helpers; never Temporal.

A HUD v6 server speaks the same wire but forgets a session when its connection closes while the
session holds no task (or a graded one). ``SERVER_TRAITS`` says so, per ``Session.server``, and
the steps consult it in three places: the start step starts the task in a new session (the
connect step's is gone), a retried grade whose session is gone reports the grade as lost (the
first try graded it, its reply was lost: grading again is impossible), and teardown does not
wait for a graded session to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, NoReturn

from ..errors import (
    ConfigError,
    ProtocolError,
    ReadyTimeoutError,
    RemoteTaskError,
    SessionGoneError,
    SubstrateGoneError,
    UnauthorizedError,
)
from ..models import Endpoint, Grade, ServerKind, Session, Task
from ..protocol import ErrorCode
from . import kept
from .envclient import EnvClient
from .envclient import connect as _open
from .tokens import endpoint_token, token_rejected, uses_derived_token

__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "REFUSED_LIMIT",
    "RESUME_TIMEOUT_S",
    "SERVER_TRAITS",
    "ServerTraits",
    "end_in",
    "end_session",
    "failed_raw",
    "fresh",
    "grade_failure",
    "grade_in",
    "lost_grade",
    "raise_start_error",
    "ready_timeout",
    "resume",
    "session_of",
    "start_client",
    "start_task",
    "to_grade",
]

DEFAULT_READY_TIMEOUT_S = 60.0
RESUME_TIMEOUT_S = 30.0
_RESUME_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # a just-closed session may not be parked yet
REFUSED_LIMIT = 3  # refusals in a row (0.1 s, 0.2 s apart) before a resumed substrate counts as gone


@dataclass(frozen=True)
class ServerTraits:
    """How a kind of server treats sessions between connections.

    Attributes:
        keeps_idle_sessions: a session without a task survives its connection (the start step
            resumes the connect step's session).
        keeps_graded_sessions: a graded session survives its connection and a repeated grade
            returns the same result (a retried grade step is harmless).
        bad_args_marker: how the server's ``tasks.start`` error says the arguments were wrong,
            when it does not use -32602 for that (HUD answers -32000 "task 'x': bad args ...").
    """

    keeps_idle_sessions: bool = True
    keeps_graded_sessions: bool = True
    bad_args_marker: str | None = None


SERVER_TRAITS: dict[ServerKind, ServerTraits] = {
    "rollouts": ServerTraits(),
    "hud": ServerTraits(keeps_idle_sessions=False, keeps_graded_sessions=False,
                        bad_args_marker=": bad args "),
}


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


async def resume(endpoint: Endpoint, session: Session, timeout: float | None = None, *,
                 patient: bool = True) -> EnvClient:
    """Reconnect to ``session``; refused -> SubstrateGoneError, unknown -> SessionGoneError.

    A refused port is reported gone after ``REFUSED_LIMIT`` refusals (``_hello``), while a slow
    substrate (a busy env loop) gets the whole resume timeout. An unknown (or still connected)
    session is asked for again a few times (a just-closed session may not be parked yet), unless
    not ``patient``.
    """
    client = kept.take(endpoint, session.session_id)  # left open by this rollout's last step
    if client is not None:
        return client
    timeout = timeout or float(endpoint.params.get("resume_timeout", RESUME_TIMEOUT_S))
    last: ProtocolError | None = None
    for delay in (*(_RESUME_BACKOFF_S if patient else ()), None):
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
    raise SessionGoneError(
        f"session {session.session_id} is unknown at {endpoint.url} (the environment restarted or "
        f"the session expired): {last.message if last else ''}"
    )


async def start_client(endpoint: Endpoint, session: Session, *, may_move: bool) -> EnvClient:
    """The connection the start step starts its task on: the connect step's session, resumed.

    On a server that keeps no task-less session (HUD's) that session ended with the connect
    step's connection, so a new one is opened when ``may_move`` (the caller records the session
    the task runs in: ``StartInput.with_session``).
    """
    client = kept.take(endpoint, session.session_id)  # the connect step's, never closed
    if client is not None:
        return client
    if may_move and not SERVER_TRAITS[session.server].keeps_idle_sessions:
        return await fresh(endpoint, RESUME_TIMEOUT_S, refused_limit=REFUSED_LIMIT)
    return await resume(endpoint, session)


def session_of(client: EnvClient) -> Session:
    """The session ``client`` speaks for, as recorded in history."""
    return Session(session_id=client.session_id, env_name=client.env.name,
                   env_version=client.env.version, bindings=list(client.bindings),
                   server=client.server)


def raise_start_error(exc: ProtocolError, task: Task, server: ServerKind = "rollouts") -> NoReturn:
    """Re-raise a refused ``tasks.start``: bad arguments are a ConfigError (final), the rest as is."""
    marker = SERVER_TRAITS[server].bad_args_marker
    if exc.code == ErrorCode.INVALID_PARAMS or (marker is not None and marker in exc.message):
        raise ConfigError(f"task {task.id!r} of env {task.env!r} was rejected: {exc.message}") from exc
    raise exc


async def start_task(client: EnvClient, task: Task, start_key: str | None = None) -> dict[str, Any]:
    """``tasks.start`` of ``task`` on ``client``; returns the prompt frame. Under ``start_key``
    a repeated start returns the first one's frame, ``client`` moved into its session."""
    try:
        return await client.start_task(task.id, dict(task.args), start_key=start_key)
    except ProtocolError as exc:
        raise_start_error(exc, task, client.server)


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


def lost_grade(session: Session, answer: str | None, agent_error: str | None, exc: SessionGoneError) -> Grade:
    """The graded error of a retried grade step that finds its session gone on a server that
    keeps no graded session (HUD's): the try before graded it and its reply was lost, or the
    environment restarted; either way the env's verdict cannot be had again, and grading the task
    a second time is impossible. A batch's ``retries`` may re-run the rollout fresh."""
    message = (f"the grade of session {session.session_id} was lost: the step was retried and the "
               f"{session.server} server no longer knows the session ({exc})")
    return Grade.error(message, raw=failed_raw(answer, agent_error or message))


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
    """Resume ``session`` briefly and end it (a server that keeps no graded session is asked
    once: a graded session there is already gone)."""
    patient = SERVER_TRAITS[session.server].keeps_graded_sessions
    client = await resume(endpoint, session, timeout=1.0, patient=patient)
    try:
        await end_in(client)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
