"""The control-channel server: JSON-RPC dispatch over sessions, plus a thin asyncio adapter.

:class:`EnvServer` validates each request's params once into the models of
``durable_rollouts.protocol`` and dispatches through a ``{Method: handler}`` table. Sessions and
their parking live in ``sessions.py``; task driving in ``runner.py``; byte tunnels in
``tunnel.py``. The asyncio part only pumps bytes through :class:`~durable_rollouts.protocol.LineProtocol`.

Every connection is served by its own task, so a slow or misbehaving client never blocks
another. Imports ``envserver`` siblings and the shared modules; nothing from ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError, InvalidStateError, ProtocolError
from ..protocol import (
    DEFAULT_MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    SERVE_PORT_ANNOUNCEMENT,
    ErrorCode,
    FrameError,
    GradeParams,
    HelloParams,
    HelloResult,
    LineProtocol,
    Method,
    StartParams,
    error_frame,
    result_frame,
    valid_request_id,
)
from .environment import Environment
from .runner import TaskRunner
from .sessions import Session, SessionState, SessionTable
from .tunnel import serve_tunnel

__all__ = ["EnvServer", "is_loopback", "serve", "serving"]

log = logging.getLogger(__name__)


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Connection:
    """Per-connection state: the bound session and whether the token was shown."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.authorized = False
        self.owner: int | None = None  # index of the token this connection showed
        self.closing = False


Handler = Callable[[_Connection, Any], Awaitable[dict[str, Any]]]


def _fail(code: int, message: str) -> ProtocolError:
    return ProtocolError(code, message)


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on the local machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EnvServer:
    """Serves one :class:`Environment` on one TCP port (use :func:`serving` to run it).

    Args:
        env: the environment to serve.
        token: when set, ``hello`` and ``tunnel.open`` must present it. Several tokens (one per
            tenant) may be given: a session is then bound to the token that created it, and only a
            connection showing that same token can resume or adopt it.
        park_ttl_s: how long a disconnected session is kept before its teardown runs.
        max_line_bytes: frame size limit; a bigger frame gets an error and the connection closes.
    """

    def __init__(
        self,
        env: Environment,
        *,
        token: str | Sequence[str] | None = None,
        park_ttl_s: float = 3600.0,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.env = env
        self.token = token
        self._tokens: tuple[str, ...] = () if token is None else (token,) if isinstance(token, str) else tuple(token)
        if token is not None and (not self._tokens or not all(isinstance(t, str) and t for t in self._tokens)):
            raise ConfigError("a token must be a non-empty string")
        self.max_line_bytes = max_line_bytes
        self.sessions = SessionTable(park_ttl_s)
        self.grade_count = 0
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._handlers: dict[Method, tuple[type[BaseModel], Handler]] = {
            Method.HELLO: (HelloParams, self._hello),
            Method.TASKS_LIST: (_NoParams, self._list),
            Method.TASKS_START: (StartParams, self._start),
            Method.TASKS_GRADE: (GradeParams, self._grade),
            Method.TASKS_CANCEL: (_NoParams, self._cancel),
            Method.BYE: (_NoParams, self._bye),
            Method.TUNNEL_OPEN: (_NoParams, self._tunnel_in_session),
        }

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Run the initialize hooks, then bind (refusing a non-loopback host without a token)."""
        if not is_loopback(host) and not self.token:
            raise ConfigError(f"binding to {host} needs a token (set ROLLOUTS_ENV_TOKEN)")
        await self.env.start()
        try:
            self._server = await asyncio.start_server(self._on_connection, host, port)
        except BaseException:
            await self.env.stop()  # the hooks ran: undo them even though we never served
            raise
        self.host = host
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, cancel every connection, tear down every session, stop the env."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conn_tasks):
            task.cancel()
        await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        await self.sessions.close_all()
        await self.env.stop()

    # -- dispatch (no I/O) ---------------------------------------------------------------------

    async def handle(self, conn: _Connection, event: dict[str, Any] | FrameError) -> dict[str, Any] | None:
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

    async def _call(self, conn: _Connection, frame: dict[str, Any]) -> dict[str, Any]:
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

    def _ensure_session(self, conn: _Connection) -> Session:
        if conn.session is None:
            if self.token is not None and not conn.authorized:
                raise _fail(ErrorCode.UNAUTHORIZED, "unauthorized: send hello with the token first")
            conn.session = self.sessions.create(owner=conn.owner)
        return conn.session

    def _match_token(self, presented: str | None) -> int | None:
        """Index of the server token equal to ``presented``; every token is compared in constant time."""
        given = (presented or "").encode()
        found: int | None = None
        for index, token in enumerate(self._tokens):
            if hmac.compare_digest(given, token.encode()) and found is None:
                found = index
        return found

    def _tunnel_allowed(self, presented: str | None) -> bool:
        return self.token is None or self._match_token(presented) is not None

    def _hello_result(self, session: Session) -> dict[str, Any]:
        return HelloResult(
            session_id=session.id,
            env={"name": self.env.name, "version": self.env.version},  # type: ignore[arg-type]
            bindings=[c.manifest() for c in self.env.capabilities],
            protocol=PROTOCOL_VERSION,
        ).model_dump()

    async def _hello(self, conn: _Connection, p: HelloParams) -> dict[str, Any]:
        if self.token is not None and not conn.authorized:
            owner = self._match_token(p.token)
            if owner is None:
                raise _fail(ErrorCode.UNAUTHORIZED, "unauthorized: missing or wrong token")
            conn.authorized, conn.owner = True, owner
        if p.protocol is not None and p.protocol != PROTOCOL_VERSION:
            raise _fail(ErrorCode.INVALID_REQUEST, f"protocol {p.protocol} unsupported (server speaks {PROTOCOL_VERSION})")
        current = conn.session
        if p.session_id is None or (current is not None and current.id == p.session_id):
            return self._hello_result(self._ensure_session(conn))
        target = self.sessions.get(p.session_id)
        if target is None or target.owner != conn.owner:  # another token's session: not yours to see
            raise _fail(ErrorCode.INVALID_REQUEST, f"unknown session {p.session_id}")
        if target.state is SessionState.LIVE:
            raise _fail(ErrorCode.INVALID_REQUEST, f"session {p.session_id} is live on another connection")
        if current is not None:
            self.sessions.park(current)
        self.sessions.resume(target)
        conn.session = target
        return self._hello_result(target)

    async def _list(self, conn: _Connection, _: _NoParams) -> dict[str, Any]:
        return {"tasks": [t.manifest() for t in self.env.templates.values()]}

    async def _start(self, conn: _Connection, p: StartParams) -> dict[str, Any]:
        session = self._ensure_session(conn)
        template = self.env.get_template(p.id)
        runner = TaskRunner(template, template.bind_arguments(p.args))
        await session.replace_runner(runner)
        try:
            return await runner.start()
        except BaseException:
            if session.runner is runner:
                session.runner = None
            raise

    async def _grade(self, conn: _Connection, p: GradeParams) -> dict[str, Any]:
        session = self._ensure_session(conn)
        if session.runner is None:
            session = await self._adopt(conn, session)
        assert session.runner is not None
        result, ran = await session.runner.grade(p.answer)
        if ran:
            self.grade_count += 1
        return result

    async def _adopt(self, conn: _Connection, current: Session) -> Session:
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

    async def _cancel(self, conn: _Connection, _: _NoParams) -> dict[str, Any]:
        await self._ensure_session(conn).replace_runner(None)
        return {"cancelled": True}

    async def _bye(self, conn: _Connection, _: _NoParams) -> dict[str, Any]:
        session, conn.session = conn.session, None
        if session is not None:
            await self.sessions.close(session)
        conn.closing = True
        return {"goodbye": True}

    async def _tunnel_in_session(self, conn: _Connection, _: _NoParams) -> dict[str, Any]:
        raise _fail(ErrorCode.METHOD_NOT_FOUND, "tunnel.open is only valid as a connection's first frame")

    # -- asyncio adapter: pump bytes through LineProtocol --------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        # Parse only the first frame: if it opens a tunnel, every later byte belongs to the pipe.
        proto = LineProtocol(self.max_line_bytes, frame_limit=1)
        conn = _Connection()
        try:
            first: list[dict[str, Any] | FrameError] = []
            while not first and not (proto.eof or proto.broken):
                await _feed(reader, proto)
                first = proto.events_received()
            head = first[0] if first else None
            if isinstance(head, dict) and head.get("method") == Method.TUNNEL_OPEN.value:
                await serve_tunnel(self.env, self._tunnel_allowed, head, proto, reader, writer)
            else:
                proto.lift_frame_limit()
                first += proto.events_received()
                await self._control(conn, proto, first, reader, writer)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass  # server shutdown; asyncio's stream callback must not see a cancelled task
        finally:
            if conn.session is not None:
                self.sessions.park(conn.session)
            writer.close()
            self._conn_tasks.discard(task)

    async def _control(
        self,
        conn: _Connection,
        proto: LineProtocol,
        pending: list[dict[str, Any] | FrameError],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        queue: asyncio.Queue[dict[str, Any] | FrameError | None] = asyncio.Queue()
        for event in pending:
            queue.put_nowait(event)

        async def pump() -> None:
            try:
                while not (proto.eof or proto.broken):
                    await _feed(reader, proto)
                    for event in proto.events_received():
                        queue.put_nowait(event)
            except (ConnectionError, OSError):
                pass
            finally:
                queue.put_nowait(None)
                if conn.session is not None:  # park at once, even while a request is in flight
                    self.sessions.park(conn.session)

        pumping = asyncio.create_task(pump())
        try:
            while (event := await queue.get()) is not None:
                reply = await self.handle(conn, event)
                if reply is not None:
                    try:
                        proto.send(reply)
                    except (ValueError, TypeError, RecursionError) as exc:  # e.g. a task echoed NaN
                        message = f"the reply could not be encoded as JSON: {type(exc).__name__}"
                        proto.send(error_frame(reply.get("id"), ErrorCode.INTERNAL_ERROR, message))
                    writer.write(proto.data_to_send())
                    await writer.drain()
                if conn.closing or (isinstance(event, FrameError) and event.fatal):
                    break
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping


async def _feed(reader: asyncio.StreamReader, proto: LineProtocol) -> None:
    data = await reader.read(65536)
    if data:
        proto.receive_data(data)
    else:
        proto.receive_eof()


@contextlib.asynccontextmanager
async def serving(
    env: Environment,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | Sequence[str] | None = None,
    park_ttl_s: float = 3600.0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> AsyncIterator[EnvServer]:
    """Serve ``env`` in-process for the duration of the block.

    Example::

        async with serving(env) as server:
            client = await connect(server.url)
    """
    server = EnvServer(env, token=token, park_ttl_s=park_ttl_s, max_line_bytes=max_line_bytes)
    await server.start(host, port)
    try:
        yield server
    finally:
        await server.stop()


async def serve(
    env: Environment,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | Sequence[str] | None = None,
    park_ttl_s: float = 3600.0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> None:
    """Serve ``env`` until cancelled; prints ``ROLLOUTS_SERVE_PORT=<port>`` once ready."""
    async with serving(
        env, host, port, token=token, park_ttl_s=park_ttl_s, max_line_bytes=max_line_bytes
    ) as server:
        print(f"{SERVE_PORT_ANNOUNCEMENT}{server.port}", flush=True, file=sys.stdout)
        await asyncio.Event().wait()
