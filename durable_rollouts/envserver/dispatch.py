"""Control-channel dispatch: one received event in, its reply frame out; no sockets here.

:class:`Dispatcher` validates each request's params once into the models of
``durable_rollouts.protocol`` and dispatches through a ``{Method: handler}`` table over the
sessions of ``sessions.py`` (task driving is in ``runner.py``). It also enforces the task limit:
at most ``max_tasks`` tasks in progress at once, live or parked. The asyncio adapter, the
connection limit and the constant-time token comparison are added by
:class:`~durable_rollouts.envserver.server.EnvServer`.

Imports ``envserver`` siblings and the shared modules; nothing from ``sdk``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError, InvalidStateError, ProtocolError
from ..protocol import (
    RESUMED_SESSION,
    SERVER_FEATURES,
    SUPPORTED_PROTOCOLS,
    ErrorCode,
    FrameError,
    GradeParams,
    HelloParams,
    HelloResult,
    Method,
    StartParams,
    error_frame,
    result_frame,
    valid_request_id,
)
from .environment import Environment
from .runner import TaskRunner
from .sessions import Session, SessionState, SessionTable

__all__ = ["DEFAULT_MAX_TASKS", "Connection", "Dispatcher"]

log = logging.getLogger(__name__)

DEFAULT_MAX_TASKS = 2048
"""Tasks in progress (started, not yet graded or ended) at once, counting parked sessions.

A guard against runaway clients, not a throttle: above the 1,900 rollouts one batch workflow
keeps in flight at most, so a server shared by a whole batch workflow (LocalRuntime, a borrowed
``tcp://`` server) never refuses its rollouts; a wider batch (run as parts) sharing one server may need a higher
``max_tasks``."""


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Connection:
    """Per-connection state: the bound session and whether the token was shown."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.authorized = False
        self.owner: int | None = None  # index of the token this connection showed
        self.closing = False


Handler = Callable[[Connection, Any], Awaitable[dict[str, Any]]]


def _fail(code: int, message: str) -> ProtocolError:
    return ProtocolError(code, message)


class Dispatcher:
    """The JSON-RPC methods of the control channel over one :class:`SessionTable`.

    Args:
        env: the environment whose tasks are served.
        token: when set, ``hello`` must present it (one per tenant when several; a session is
            bound to the token that created it).
        park_ttl_s: how long a disconnected session is kept before its teardown runs.
        max_tasks: tasks in progress at once (live or parked); one more ``tasks.start`` is refused
            with ``ErrorCode.BUSY``.
    """

    def __init__(
        self,
        env: Environment,
        *,
        token: str | Sequence[str] | None = None,
        park_ttl_s: float = 3600.0,
        max_tasks: int = DEFAULT_MAX_TASKS,
    ) -> None:
        self.env = env
        self.token = token
        self._tokens: tuple[str, ...] = () if token is None else (token,) if isinstance(token, str) else tuple(token)
        if token is not None and (not self._tokens or not all(isinstance(t, str) and t for t in self._tokens)):
            raise ConfigError("a token must be a non-empty string")
        if max_tasks < 1:
            raise ConfigError(f"max_tasks must be at least 1, got {max_tasks}")
        self.max_tasks = max_tasks
        self._warned_full = False  # the task limit is warned about once per server
        self.sessions = SessionTable(park_ttl_s)
        self.grade_count = 0
        self._handlers: dict[Method, tuple[type[BaseModel], Handler]] = {
            Method.HELLO: (HelloParams, self._hello),
            Method.TASKS_LIST: (_NoParams, self._list),
            Method.TASKS_START: (StartParams, self._start),
            Method.TASKS_GRADE: (GradeParams, self._grade),
            Method.TASKS_CANCEL: (_NoParams, self._cancel),
            Method.BYE: (_NoParams, self._bye),
            Method.TUNNEL_OPEN: (_NoParams, self._tunnel_in_session),
        }

    def _match_token(self, presented: str | None) -> int | None:
        """Index of the server token equal to ``presented`` (``EnvServer`` compares in constant time)."""
        raise NotImplementedError

    async def handle(self, conn: Connection, event: dict[str, Any] | FrameError) -> dict[str, Any] | None:
        """Turn one received event into its reply frame (None for a notification)."""
        if isinstance(event, FrameError):
            return error_frame(event.id, event.code, event.message)
        request_id = event.get("id")
        if not valid_request_id(request_id):
            return error_frame(None, ErrorCode.INVALID_REQUEST, "a request id must be a string, a number or null")
        try:
            result = await self._call(conn, event)
        except ProtocolError as exc:
            reply = error_frame(request_id, exc.code, exc.message)
        except ConfigError as exc:
            reply = error_frame(request_id, ErrorCode.INVALID_PARAMS, str(exc))
        except InvalidStateError as exc:
            reply = error_frame(request_id, ErrorCode.INVALID_REQUEST, str(exc))
        except Exception as exc:
            log.exception("request %r failed", event.get("method"))
            reply = error_frame(request_id, ErrorCode.TASK_ERROR, f"{type(exc).__name__}: {exc}")
        else:
            reply = result_frame(request_id, result)
        return reply if "id" in event else None

    async def _call(self, conn: Connection, frame: dict[str, Any]) -> dict[str, Any]:
        name = frame.get("method")
        if not isinstance(name, str):
            raise _fail(ErrorCode.INVALID_REQUEST, "a request needs a string 'method'")
        try:
            method = Method(name)
        except ValueError:
            raise _fail(ErrorCode.METHOD_NOT_FOUND, f"method not found: {name}") from None
        model, handler = self._handlers[method]
        raw = frame.get("params")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise _fail(ErrorCode.INVALID_PARAMS, "params must be an object")
        try:
            params = model.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "params"
            raise _fail(ErrorCode.INVALID_PARAMS, f"bad params for {name}: {where}: {err['msg']}") from None
        if method is not Method.HELLO:
            self._ensure_session(conn)
        return await handler(conn, params)

    def _ensure_session(self, conn: Connection) -> Session:
        if conn.session is None:
            if self.token is not None and not conn.authorized:
                raise _fail(ErrorCode.UNAUTHORIZED, "unauthorized: send hello with the token first")
            conn.session = self.sessions.create(owner=conn.owner)
        return conn.session

    def _hello_result(self, session: Session, protocol: str) -> dict[str, Any]:
        return HelloResult(
            session_id=session.id,
            env={"name": self.env.name, "version": self.env.version},  # type: ignore[arg-type]
            bindings=[c.manifest() for c in self.env.capabilities],
            protocol=protocol,
            features=list(SERVER_FEATURES),
        ).model_dump()

    async def _hello(self, conn: Connection, p: HelloParams) -> dict[str, Any]:
        if self.token is not None and not conn.authorized:
            owner = self._match_token(p.token)
            if owner is None:
                raise _fail(ErrorCode.UNAUTHORIZED, "unauthorized: missing or wrong token")
            conn.authorized, conn.owner = True, owner
        protocol = p.negotiate()
        if protocol is None:
            speaks = ", ".join(SUPPORTED_PROTOCOLS)
            raise _fail(ErrorCode.INVALID_REQUEST, f"protocol {p.protocol} unsupported (server speaks {speaks})")
        current = conn.session
        if p.session_id is None or (current is not None and current.id == p.session_id):
            return self._hello_result(self._ensure_session(conn), protocol)
        target = self.sessions.get(p.session_id)
        if target is None or target.owner != conn.owner:  # another token's session: not yours to see
            raise _fail(ErrorCode.INVALID_REQUEST, f"unknown session {p.session_id}")
        if target.state is SessionState.LIVE:
            raise _fail(ErrorCode.INVALID_REQUEST, f"session {p.session_id} is live on another connection")
        if current is not None:
            self.sessions.park(current)
        self.sessions.resume(target)
        conn.session = target
        return self._hello_result(target, protocol)

    async def _list(self, conn: Connection, _: _NoParams) -> dict[str, Any]:
        return {"tasks": [t.manifest() for t in self.env.templates.values()]}

    async def _start(self, conn: Connection, p: StartParams) -> dict[str, Any]:
        session = self._ensure_session(conn)
        if p.start_key is not None and (again := await self._started_before(conn, session, p.start_key)):
            return again
        template = self.env.get_template(p.id)
        args = template.bind_arguments(p.args)
        # Replacing this session's own task needs no new slot. No await between this check and
        # replace_runner installing the runner, so concurrent starts cannot overshoot the limit.
        busy = self.sessions.tasks_in_progress(excluding=session)
        if busy >= self.max_tasks:
            if not self._warned_full:
                self._warned_full = True
                log.warning("env %r is at its limit of %d tasks in progress (max_tasks): further "
                            "tasks.start calls are refused as busy and retried until a session "
                            "ends; raise it with `rollouts serve --max-tasks N` (serve(env, "
                            "max_tasks=N)) or serve the env on more substrates",
                            self.env.name, self.max_tasks)
            raise _fail(
                ErrorCode.BUSY,
                f"server busy: {busy} tasks in progress (limit {self.max_tasks}); retry when a session ends",
            )
        runner = TaskRunner(template, args)
        await session.replace_runner(runner)
        try:
            prompt = await runner.start()
        except BaseException:
            if session.runner is runner:
                session.runner = None
            raise
        if p.start_key is not None:
            self.sessions.remember_start(p.start_key, session)
        return prompt

    async def _started_before(self, conn: Connection, session: Session, key: str) -> dict[str, Any] | None:
        """The prompt frame of the task already started under ``key`` (a replayed start step),
        this connection moved into its session, which is named in the frame
        (``RESUMED_SESSION``); None to start the task (nothing started under ``key``, or its
        session is live on another connection, e.g. a hung worker's)."""
        prior = self.sessions.started_under(key, conn.owner)
        if prior is None or prior.runner is None or prior.runner.prompt is None or not prior.runner.in_progress:
            return None
        if prior is session:  # the same session asks again (a retry after a lost reply)
            return dict(prior.runner.prompt)
        if prior.state is not SessionState.PARKED:
            return None
        if session.runner is None:
            await self.sessions.close(session)  # the connect step's, never used
        else:
            self.sessions.park(session)
        self.sessions.resume(prior)
        conn.session = prior
        return {**prior.runner.prompt, RESUMED_SESSION: prior.id}

    async def _grade(self, conn: Connection, p: GradeParams) -> dict[str, Any]:
        session = self._ensure_session(conn)
        if session.runner is None:
            session = await self._adopt(conn, session)
        assert session.runner is not None
        result, ran = await session.runner.grade(p.answer)
        if ran:
            self.grade_count += 1
        return result

    async def _adopt(self, conn: Connection, current: Session) -> Session:
        """Rebind this connection to the lone parked session that has a task to grade.

        The adopted session keeps its id, so a client that knows it can still resume it (and
        get the cached grade); the connection's own task-less session is closed.
        """
        parked = [s for s in self.sessions.parked_with_task() if s is not current and s.owner == conn.owner]
        if not parked:
            raise _fail(ErrorCode.INVALID_REQUEST, "no task in progress")
        if len(parked) > 1:
            ids = ", ".join(s.id for s in parked)
            raise _fail(
                ErrorCode.INVALID_REQUEST,
                f"{len(parked)} parked sessions ({ids}); resume one by sending hello with its session_id",
            )
        adopted = parked[0]
        self.sessions.resume(adopted)
        conn.session = adopted
        await self.sessions.close(current)
        return adopted

    async def _cancel(self, conn: Connection, _: _NoParams) -> dict[str, Any]:
        await self._ensure_session(conn).replace_runner(None)
        return {"cancelled": True}

    async def _bye(self, conn: Connection, _: _NoParams) -> dict[str, Any]:
        session, conn.session = conn.session, None
        if session is not None:
            await self.sessions.close(session)
        conn.closing = True
        return {"goodbye": True}

    async def _tunnel_in_session(self, conn: Connection, _: _NoParams) -> dict[str, Any]:
        raise _fail(ErrorCode.METHOD_NOT_FOUND, "tunnel.open is only valid as a connection's first frame")
