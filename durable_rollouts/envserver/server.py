"""The control-channel server: a thin asyncio adapter around :class:`~.dispatch.Dispatcher`.

:class:`EnvServer` binds one TCP port (a client on the server's own event loop reaches it over
a socket pair instead, ``streams.open_stream``), serves every connection in its own task (a slow or
misbehaving client never blocks another) and only pumps bytes through
:class:`~durable_rollouts.protocol.LineProtocol`; request handling lives in ``dispatch.py``,
sessions in ``sessions.py``, byte tunnels in ``tunnel.py``. It compares tokens in constant time and
enforces the connection limit: one connection over ``max_connections`` gets one
``ErrorCode.BUSY`` error frame and is closed.

Imports ``envserver`` siblings and the shared modules; nothing from ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import ConfigError
from ..hud_detect import is_hud_environment
from ..protocol import (
    DEFAULT_MAX_LINE_BYTES,
    SERVE_PORT_ANNOUNCEMENT,
    ErrorCode,
    FrameError,
    LineProtocol,
    Method,
    error_frame,
)
from ..settings import var
from ..streams import StreamPair, register_local, unregister_local
from .dispatch import DEFAULT_MAX_TASKS, Connection, Dispatcher
from .environment import Environment
from .hud_env import check_hud_serving, serving_hud
from .tunnel import serve_tunnel

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_TASKS", "EnvServer", "is_loopback", "serve", "serving"]

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 4096
"""Connections (control and tunnel) served at once: room for two per rollout of a full batch
workflow (at most 1,900 in flight), so a shared server is never the throttle. Needs ``ulimit -n`` above it."""

REFUSE_LINGER_S = 1.0
"""How long a refused connection may take to send its EOF after the busy frame."""


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on the local machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EnvServer(Dispatcher):
    """Serves one :class:`Environment` on one TCP port (use :func:`serving` to run it).

    Args:
        env: the environment to serve.
        token: when set, ``hello`` and ``tunnel.open`` must present it. Several tokens (one per
            tenant) may be given: a session is then bound to the token that created it, and only a
            connection showing that same token can resume or adopt it.
        park_ttl_s: how long a disconnected session is kept before its teardown runs.
        max_line_bytes: frame size limit; a bigger frame gets an error and the connection closes.
        max_connections: connections (control and tunnel) served at once; one more gets an
            ``ErrorCode.BUSY`` error frame and is closed.
        max_tasks: tasks in progress at once, in live and parked sessions; one more
            ``tasks.start`` gets an ``ErrorCode.BUSY`` error frame.
    """

    def __init__(
        self,
        env: Environment,
        *,
        token: str | Sequence[str] | None = None,
        park_ttl_s: float = 3600.0,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_tasks: int = DEFAULT_MAX_TASKS,
    ) -> None:
        super().__init__(env, token=token, park_ttl_s=park_ttl_s, max_tasks=max_tasks)
        if max_connections < 1:
            raise ConfigError(f"max_connections must be at least 1, got {max_connections}")
        self.max_line_bytes = max_line_bytes
        self.max_connections = max_connections
        self._warned_full_connections = False  # the connection limit is warned about once
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._refusals: set[asyncio.Task[Any]] = set()
        self._local_tasks: set[asyncio.Task[Any]] = set()  # socket-pair connections (own loop)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Run the initialize hooks, then bind (refusing a non-loopback host without a token)."""
        if not is_loopback(host) and not self.token:
            raise ConfigError(f"binding to {host} needs a token (set {var('env_token')})")
        await self.env.start()
        try:
            self._server = await asyncio.start_server(self._on_connection, host, port)
        except BaseException:
            await self.env.stop()  # the hooks ran: undo them even though we never served
            raise
        self.host = host
        self.port = self._server.sockets[0].getsockname()[1]
        register_local(host, self.port, self._connect_local)

    async def _connect_local(self) -> StreamPair:
        """A client stream served like an accepted TCP connection, over a socket pair (a
        client on this server's own loop: an in-process environment)."""
        if self._server is None or not self._server.is_serving():
            raise ConnectionRefusedError(f"{self.url} is not serving")
        ours, theirs = socket.socketpair()
        try:
            reader, writer = await asyncio.open_connection(sock=theirs)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        task = asyncio.get_running_loop().create_task(self._on_connection(reader, writer))
        self._local_tasks.add(task)
        task.add_done_callback(self._local_tasks.discard)
        try:
            return await asyncio.open_connection(sock=ours)
        except BaseException:
            ours.close()
            task.cancel()
            raise

    async def stop(self) -> None:
        """Stop accepting, cancel every connection, tear down every session, stop the env."""
        unregister_local(self.host, self.port, self._connect_local)
        if self._server is not None:
            self._server.close()
        tasks = self._conn_tasks | self._refusals | self._local_tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.sessions.close_all()
        await self.env.stop()

    # -- tokens --------------------------------------------------------------------------------

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

    # -- asyncio adapter: pump bytes through LineProtocol --------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conn_tasks) >= self.max_connections:
            await self._refuse(task, reader, writer)
            return
        self._conn_tasks.add(task)
        # Parse only the first frame: if it opens a tunnel, every later byte belongs to the pipe.
        proto = LineProtocol(self.max_line_bytes, frame_limit=1)
        conn = Connection()
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

    async def _refuse(self, task: asyncio.Task[Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Over the connection limit: send one busy error frame (id null) and close."""
        if not self._warned_full_connections:
            self._warned_full_connections = True
            log.warning("env %r is at its limit of %d open connections (max_connections): "
                        "further connections are refused as busy; raise it with `rollouts serve "
                        "--max-connections N` (serve(env, max_connections=N))",
                        self.env.name, self.max_connections)
        self._refusals.add(task)
        proto = LineProtocol(self.max_line_bytes)
        message = f"server busy: {self.max_connections} connections open (the limit); retry later"
        proto.send(error_frame(None, ErrorCode.BUSY, message))
        try:
            writer.write(proto.data_to_send())
            if writer.can_write_eof():
                writer.write_eof()
            # Read what the peer already sent before closing: closing over unread bytes resets
            # the connection, which can destroy the frame before the peer reads it. Skipped when
            # many refusals are pending, so a flood cannot hold descriptors for long.
            if len(self._refusals) <= self.max_connections:
                await asyncio.wait_for(_discard(reader), REFUSE_LINGER_S)
        except (OSError, asyncio.CancelledError):  # TimeoutError and ConnectionError are OSErrors
            pass
        finally:
            writer.close()
            self._refusals.discard(task)

    async def _control(
        self,
        conn: Connection,
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


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


@contextlib.asynccontextmanager
async def serving(
    env: Environment,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | Sequence[str] | None = None,
    park_ttl_s: float = 3600.0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> AsyncIterator[EnvServer]:
    """Serve ``env`` in-process for the duration of the block.

    A HUD v6 ``hud.Environment`` is served by hud's own server instead (``hud_env``; loopback, no
    token, the limits do not apply); the block then gets a :class:`~.hud_env.HudServer`.

    Example::

        async with serving(env) as server:
            client = await connect(server.url)
    """
    if is_hud_environment(env):
        check_hud_serving(env, loopback=is_loopback(host), token=token)
        async with serving_hud(env, host, port) as hud_server:
            yield hud_server  # type: ignore[misc]
        return
    server = EnvServer(
        env,
        token=token,
        park_ttl_s=park_ttl_s,
        max_line_bytes=max_line_bytes,
        max_connections=max_connections,
        max_tasks=max_tasks,
    )
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
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> None:
    """Serve ``env`` (ours, or a HUD v6 one: see :func:`serving`) until cancelled; prints
    ``ROLLOUTS_SERVE_PORT=<port>`` once ready."""
    async with serving(
        env,
        host,
        port,
        token=token,
        park_ttl_s=park_ttl_s,
        max_line_bytes=max_line_bytes,
        max_connections=max_connections,
        max_tasks=max_tasks,
    ) as server:
        print(f"{SERVE_PORT_ANNOUNCEMENT}{server.port}", flush=True, file=sys.stdout)
        await asyncio.Event().wait()
