"""The mcp capability: serve a fastmcp server's tools over HTTP on loopback, published as ``mcp``.

``McpService.start()`` (run from an initialize hook) binds a free 127.0.0.1 port, starts the
server's streamable-HTTP transport in a background task and waits until the port accepts
connections (polling ``connect``, never a fixed sleep). A server that crashes or never comes up
fails the serve with an ``EnvError`` naming the capability. A plain URL instead of a server
publishes an already running daemon after the same readiness check.

Clients reach the url through the control channel's ``tunnel.open``, so the server only ever
listens on loopback. Imports fastmcp lazily (only for type checking here), ``errors`` and
``.environment``; never the server, the client or anything under ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..backoff import delays
from ..errors import EnvError
from .capability import Capability, CapabilityHost

if TYPE_CHECKING:
    from fastmcp import FastMCP


__all__ = ["McpService", "add_mcp", "wait_until_listening"]

log = logging.getLogger(__name__)


async def wait_until_listening(
    host: str,
    port: int,
    *,
    timeout_s: float,
    what: str,
    watch: asyncio.Task[Any] | None = None,
) -> None:
    """Poll ``connect(host, port)`` until it succeeds.

    Raises:
        EnvError: ``watch`` (the task serving the port) ended first, or ``timeout_s`` passed;
            the message names ``what``.
    """
    deadline = time.monotonic() + timeout_s
    pauses = delays(0.005, 0.1)
    while True:
        if watch is not None and watch.done():
            exc = None if watch.cancelled() else watch.exception()
            raise EnvError(f"{what} stopped before it accepted connections: {exc!r}") from exc
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (TimeoutError, OSError):
            if time.monotonic() >= deadline:
                raise EnvError(
                    f"{what} did not accept connections on {host}:{port} within {timeout_s:g}s"
                ) from None
            await asyncio.sleep(next(pauses))
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return


class McpService:
    """One fastmcp server (or external MCP url) published as an ``mcp`` capability.

    Args:
        server: a ``fastmcp.FastMCP`` to serve in-process, or the http url of a running daemon.
        name: the capability name.
        path: the HTTP path of the MCP endpoint.
        ready_timeout_s: how long the server may take to accept connections.
    """

    def __init__(
        self,
        server: FastMCP | str,
        *,
        name: str = "tools",
        path: str = "/mcp",
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.server = server
        self.name = name
        self.path = "/" + path.strip("/")
        self.ready_timeout_s = ready_timeout_s
        self.capability: Capability | None = None
        self._task: asyncio.Task[None] | None = None
        self._uvicorn: Any = None

    async def start(self) -> Capability:
        """Start serving (if in-process), wait until it accepts connections; the capability."""
        if self.capability is not None:
            return self.capability
        what = f"mcp capability {self.name!r}"
        if isinstance(self.server, str):
            url = self.server
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise EnvError(f"{what}: url {url!r} is not http(s)://host:port/path")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            await wait_until_listening(parts.hostname, port, timeout_s=self.ready_timeout_s,
                                       what=what)
        else:
            # Bound but not listening: connects are refused until uvicorn really serves, and no
            # other process can take the port in between.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            self._task = asyncio.create_task(self._serve(sock, port), name=f"mcp:{self.name}")
            try:
                await wait_until_listening("127.0.0.1", port, timeout_s=self.ready_timeout_s,
                                           what=what, watch=self._task)
            except BaseException:
                await self.stop()
                raise
            url = f"http://127.0.0.1:{port}{self.path}"
        self.capability = Capability.mcp(name=self.name, url=url, transport="streamable-http")
        return self.capability

    async def _serve(self, sock: socket.socket, port: int) -> None:
        import uvicorn  # a fastmcp dependency

        assert not isinstance(self.server, str)
        app = self.server.http_app(path=self.path, transport="http")
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=2)
        self._uvicorn = _uvicorn_server(config)
        try:
            await self._uvicorn.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process on a failed startup; not here
            raise EnvError(
                f"mcp server {self.name!r} failed to start (uvicorn exit {exc.code})"
            ) from None
        finally:
            sock.close()

    async def stop(self) -> None:
        """Stop an in-process server gracefully (bounded wait, then cancel)."""
        task, self._task = self._task, None
        self.capability = None
        if task is None:
            return
        started = self._uvicorn is not None and self._uvicorn.started
        if started:
            self._uvicorn.should_exit = True
        try:
            if not started:  # still starting (or hung in its lifespan): nothing to drain
                raise TimeoutError
            await asyncio.wait_for(asyncio.shield(task), 5)
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._uvicorn = None


def _uvicorn_server(config: Any) -> Any:
    import uvicorn  # a fastmcp dependency

    class QuietServer(uvicorn.Server):
        # The env server owns SIGINT/SIGTERM; uvicorn must not capture them for itself.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer(config)


def add_mcp(
    env: CapabilityHost,
    server: FastMCP | str,
    *,
    name: str = "tools",
    **kwargs: Any,
) -> McpService:
    """Declare an mcp capability on ``env``: started by an initialize hook, stopped at shutdown."""
    service = McpService(server, name=name, **kwargs)

    async def _start_mcp() -> None:
        env.add_capability(await service.start())

    async def _stop_mcp() -> None:
        await service.stop()

    _start_mcp.__qualname__ = f"mcp[{name}].start"
    _stop_mcp.__qualname__ = f"mcp[{name}].stop"
    env.initialize(_start_mcp)
    env.shutdown(_stop_mcp)
    return service
