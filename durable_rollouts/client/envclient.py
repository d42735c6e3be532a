"""Control-channel client: ``connect(url)`` -> :class:`EnvClient`.

Calls are serialized by a lock and framed by the shared sans-I/O
:class:`~durable_rollouts.protocol.LineProtocol`; error frames become ``ProtocolError``
subclasses at once. ``connect`` retries until the server answers ``hello`` (refused, EOF,
accepted-then-closed and other ``OSError`` mean "not ready yet"). For every binding the client
opens a loopback forwarder that tunnels through ``tunnel.open``, so ``binding(name)`` returns a
url reachable from here, and ``await open(name)`` a live client for it (cached; closed with the
client). ``close()`` does not send ``bye``: the session parks on the server.
It also drives a HUD v6 server (same wire; its hello reply names no protocol): ``server`` says
which kind answered, for the steps that must treat HUD's sessions differently (``channel``).

Imports only the shared protocol/errors/streams modules and ``.capabilities``; never ``envserver``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from ..backoff import delays
from ..errors import (
    ConfigError,
    ConnectionLostError,
    ProtocolError,
    ReadyTimeoutError,
)
from ..models import ServerKind
from ..protocol import (
    FEATURE_START_KEY,
    PROTOCOL_VERSION,
    RESUMED_SESSION,
    SUPPORTED_PROTOCOLS,
    EnvInfo,
    ErrorCode,
    HelloResult,
    Method,
    error_from_frame,
    request_frame,
)
from ..streams import pipe
from .capabilities import close_capability, find_binding, open_capability
from .framed import FramedStream, parse_url
from .manifest import Manifest

__all__ = ["EnvClient", "connect", "parse_url"]

log = logging.getLogger(__name__)


class EnvClient:
    """A connected control-channel session (build it with :func:`connect`)."""

    def __init__(self, url: str, stream: FramedStream, *, token: str | None = None) -> None:
        self.url = url
        self.host, self.port = parse_url(url)
        self.token = token
        self.session_id: str | None = None
        self.features: frozenset[str] = frozenset()  # the optional extensions the server named
        self.server: ServerKind = "rollouts"  # "hud": a HUD v6 server (its hello reply names no protocol)
        self.env: EnvInfo | None = None
        self.bindings: list[dict[str, Any]] = []
        self.manifest: Manifest | None = None  # the hello reply, as HUD's client has it
        self._stream: FramedStream | None = stream
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._forwarders: dict[str, tuple[asyncio.Server, dict[str, Any]]] = {}
        self._keepalive: asyncio.Task[None] | None = None
        self._tunnels: set[asyncio.Task[Any]] = set()
        self._opened: dict[str, Any] = {}
        self._opening = asyncio.Lock()

    @property
    def connected(self) -> bool:
        """False once the connection was closed (by either side's close, ``bye`` or a failure)."""
        return self._stream is not None

    # -- calls ---------------------------------------------------------------------------------

    async def _call(self, method: Method, params: dict[str, Any] | None = None) -> dict[str, Any]:
        async with self._lock:
            stream = self._stream
            if stream is None:
                raise ConnectionLostError("the client is closed")
            self._next_id += 1
            request_id = self._next_id
            try:
                await stream.send(request_frame(request_id, method.value, params))
                reply = await stream.receive()
            except (OSError, ConnectionError) as exc:
                self._drop()
                if isinstance(exc, ConnectionLostError):
                    raise
                raise ConnectionLostError(f"control channel lost during {method.value}: {exc}") from exc
            except BaseException:
                self._drop()  # a cancelled call leaves the stream mid-frame: unusable
                raise
            if reply.get("id") != request_id:
                self._drop()
                if reply.get("id") is None and "error" in reply:  # refused before our request was read
                    raise error_from_frame(reply["error"])
                raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"reply id {reply.get('id')!r} != request id {request_id}")
            if "error" in reply:
                raise error_from_frame(reply["error"])
            result = reply.get("result")
            if not isinstance(result, dict):
                self._drop()
                raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"non-object result: {result!r}")
            return result

    async def hello(self, session_id: str | None = None) -> Manifest:
        """Open (or resume, with ``session_id``) a session; starts binding forwarders.

        Returns the :class:`Manifest` (also kept as ``self.manifest``); it reads as the reply
        dict too."""
        params: dict[str, Any] = {"protocol": PROTOCOL_VERSION}
        if session_id is not None:
            params["session_id"] = session_id
        if self.token is not None:
            params["token"] = self.token
        result = await self._call(Method.HELLO, params)
        # A HUD v6 server names no protocol in its reply (and ignores ours): its wire is ours.
        spoken = result.get("protocol")
        if spoken is not None and spoken not in SUPPORTED_PROTOCOLS:
            self._drop()
            raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"server speaks protocol {spoken!r}")
        try:
            info = HelloResult.model_validate({**result, "bindings": result.get("bindings") or []})
        except ValidationError as exc:
            self._drop()
            raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"malformed hello reply: {exc.errors()[0]['msg']}") from None
        self.server = "rollouts" if spoken is not None else "hud"
        self.features = frozenset(info.features)
        self.session_id = info.session_id
        self.env = info.env
        self.bindings = info.bindings
        self.manifest = manifest = Manifest.from_hello(result, info.session_id, info.env, info.bindings)
        await self._start_forwarders()
        return manifest

    async def list_tasks(self) -> list[dict[str, Any]]:
        """The ``tasks.list`` entries."""
        tasks = (await self._call(Method.TASKS_LIST)).get("tasks")
        if not isinstance(tasks, list):
            raise ProtocolError(ErrorCode.INTERNAL_ERROR, f"malformed tasks.list reply: {str(tasks)[:100]}")
        return tasks

    async def start_task(self, id: str, args: dict[str, Any] | None = None, *,
                         start_key: str | None = None) -> dict[str, Any]:
        """Start task ``id``; returns the prompt frame.

        ``start_key`` (sent only to a server that names ``FEATURE_START_KEY``): a start already
        made under it returns that task's prompt frame, and this client speaks for its session
        from then on (``session_id`` changes), so the task's setup runs once."""
        params: dict[str, Any] = {"id": id, "args": args or {}}
        keyed = start_key is not None and FEATURE_START_KEY in self.features
        if keyed:
            params["start_key"] = start_key
        frame = await self._call(Method.TASKS_START, params)
        moved = frame.pop(RESUMED_SESSION, None) if keyed else None
        if isinstance(moved, str) and moved:
            self.session_id = moved
            if self.manifest is not None:
                self.manifest = dataclasses.replace(self.manifest, session_id=moved)
        return frame

    async def grade(self, answer: Any, **extra: Any) -> dict[str, Any]:
        """Grade the session's task (or adopt the lone parked one); returns the score frame."""
        return await self._call(Method.TASKS_GRADE, {"answer": answer, **extra})

    async def cancel(self) -> dict[str, Any]:
        """Cancel the session's task (its teardown runs)."""
        return await self._call(Method.TASKS_CANCEL)

    async def bye(self) -> None:
        """End the session for good, then close."""
        try:
            await self._call(Method.BYE)
        finally:
            await self.close()

    # -- bindings and forwarders ---------------------------------------------------------------

    def binding(self, name: str) -> dict[str, Any]:
        """The binding matching ``name`` (by name, protocol or protocol family), url rewritten
        to this client's loopback forwarder.

        Raises:
            KeyError: nothing matches.
            ConfigError: several bindings match.
        """
        matches = [
            b for b in self.bindings
            if name in (b.get("name"), b.get("protocol"), str(b.get("protocol", "")).split("/")[0])
        ]
        if not matches:
            raise KeyError(f"no binding {name!r} (have: {[b.get('name') for b in self.bindings]})")
        if len(matches) > 1:
            raise ConfigError(f"binding {name!r} is ambiguous: {[b.get('name') for b in matches]}")
        found = matches[0]
        forwarder = self._forwarders.get(found["name"])
        return dict(forwarder[1]) if forwarder else dict(found)

    async def open(self, name: str) -> Any:
        """A live client for capability ``name`` (by name, or a protocol family when unambiguous).

        ``ssh/*``: an ``asyncssh.SSHClientConnection``; ``mcp/*``: a connected ``fastmcp.Client``;
        anything else: an ``(asyncio.StreamReader, asyncio.StreamWriter)`` pair (see
        :mod:`durable_rollouts.client.capabilities`). Opened once per client and binding, then
        cached; :meth:`close_capabilities` (or :meth:`close`) closes them.

        Raises:
            CapabilityNotFoundError: the environment publishes no such capability (the message
                lists the bindings it has).
        """
        key = find_binding(self.bindings, name)["name"]
        async with self._opening:  # two concurrent opens of one binding share one connection
            if key not in self._opened:
                self._opened[key] = await open_capability(self, key)
            return self._opened[key]

    async def close_capabilities(self) -> None:
        """Close every capability client :meth:`open` handed out (best effort)."""
        opened, self._opened = self._opened, {}
        for handle in opened.values():
            await close_capability(handle)

    async def _start_forwarders(self) -> None:
        for binding in self.bindings:
            name = binding.get("name")
            if not name or name in self._forwarders or not binding.get("url"):
                continue
            server = await asyncio.start_server(
                lambda r, w, cap=name: self._forward(cap, r, w), "127.0.0.1", 0
            )
            local_port = server.sockets[0].getsockname()[1]
            self._forwarders[name] = (server, {**binding, "url": _rewrite(binding["url"], local_port)})

    async def _forward(self, capability: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tunnels.add(task)
        stream: FramedStream | None = None
        try:
            stream = await FramedStream.open(self.host, self.port)
            stream.proto.frame_limit = 1  # bytes after the reply belong to the capability
            params: dict[str, Any] = {"capability": capability}
            if self.token is not None:
                params["token"] = self.token
            await stream.send(request_frame(1, Method.TUNNEL_OPEN.value, params))
            reply = await stream.receive()
            if "error" in reply:
                raise error_from_frame(reply["error"])
            leftover = stream.proto.take_buffered()
            if leftover:
                writer.write(leftover)
            await pipe((reader, writer), (stream.reader, stream.writer))
        except Exception as exc:  # a failed tunnel only closes this forwarded connection
            log.warning("tunnel to %r failed: %s", capability, exc)
        except asyncio.CancelledError:
            pass  # the client closed; asyncio's stream callback must not see a cancelled task
        finally:
            if stream is not None:
                stream.close()
            writer.close()
            self._tunnels.discard(task)  # type: ignore[arg-type]

    # -- keepalive and closing -----------------------------------------------------------------

    def start_keepalive(self, interval_s: float) -> None:
        """Re-send ``hello{own id}`` every ``interval_s`` until closed or an error occurs."""
        if self._keepalive is None:
            self._keepalive = asyncio.create_task(self._keepalive_loop(interval_s))

    async def _keepalive_loop(self, interval_s: float) -> None:
        while self._stream is not None:
            await asyncio.sleep(interval_s)
            if self._lock.locked():
                continue  # a call is in flight: the connection is evidently alive
            try:
                await asyncio.wait_for(self.hello(self.session_id), timeout=max(5.0, interval_s))
            except Exception as exc:
                log.warning("keepalive stopped: %s", exc)
                return

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    async def close(self) -> None:
        """Close the connection without ``bye`` (the session parks) and stop the forwarders."""
        if self._keepalive is not None and self._keepalive is not asyncio.current_task():
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive
        self._keepalive = None
        if self._opened:
            await self.close_capabilities()
        self._drop()
        for server, _ in self._forwarders.values():
            server.close()
        self._forwarders.clear()
        tunnels, self._tunnels = list(self._tunnels), set()
        for task in tunnels:
            task.cancel()
        await asyncio.gather(*tunnels, return_exceptions=True)

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _rewrite(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def connect(target: Any, **options: Any) -> _Connecting:
    """Connect to ``target`` (a ``tcp://`` url, or a ``Runtime``: its url and token) and say
    ``hello``: ``client = await connect(url)``, or ``async with connect(runtime) as client``
    (seed 000's form: the block closes the client). Options as :func:`_connect`."""
    url = target if isinstance(target, str) else getattr(target, "url", None)
    if not isinstance(url, str):
        raise ConfigError(f"connect() takes a tcp:// url or a Runtime, not {type(target).__name__}")
    token = (getattr(target, "params", None) or {}).get("token")
    if token is not None and "token" not in options:
        options["token"] = token
    return _Connecting(_connect(url, **options))


class _Connecting:
    """What :func:`connect` returns: awaitable (the client) and an async context manager."""

    def __init__(self, connecting: Any) -> None:
        self._connecting = connecting
        self._client: EnvClient | None = None

    def __await__(self) -> Any:
        return self._connecting.__await__()

    async def __aenter__(self) -> EnvClient:
        self._client = await self._connecting
        return self._client

    async def __aexit__(self, *exc: Any) -> None:
        if self._client is not None:
            await self._client.close()


async def _connect(
    url: str,
    *,
    ready_timeout: float = 60.0,
    session_id: str | None = None,
    token: str | None = None,
    keepalive_s: float | None = 60.0,
    refused_limit: int | None = None,
) -> EnvClient:
    """Connect and say ``hello`` (resuming ``session_id`` if given), retrying until ready.

    ``refused_limit``: re-raise a refused (or reset) connection once it happened that many times
    in a row, instead of retrying until ``ready_timeout`` (a resume: nothing listens any more).

    Raises:
        ReadyTimeoutError: no ``hello`` reply within ``ready_timeout`` seconds.
        ConnectionRefusedError, ConnectionResetError: ``refused_limit`` refusals in a row.
        ProtocolError: the server answered ``hello`` with an error (unknown session, bad token...).
        ConfigError: ``url`` is not ``tcp://host:port``.
    """
    host, port = parse_url(url)
    deadline = time.monotonic() + ready_timeout
    pauses = delays(0.1, 0.5)
    last: BaseException | None = None
    refused = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ReadyTimeoutError(f"{url} not ready after {ready_timeout:.1f} s (last error: {last})")
        client: EnvClient | None = None
        try:
            stream = await asyncio.wait_for(FramedStream.open(host, port), timeout=remaining)
            client = EnvClient(url, stream, token=token)
            await asyncio.wait_for(client.hello(session_id), timeout=max(0.05, deadline - time.monotonic()))
        except ProtocolError:
            if client is not None:
                await client.close()
            raise
        except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
            last = exc
            if client is not None:
                await client.close()
            refused = refused + 1 if isinstance(exc, (ConnectionRefusedError, ConnectionResetError)) else 0
            if refused_limit is not None and refused >= refused_limit:
                raise
        else:
            assert client is not None
            if keepalive_s:
                client.start_keepalive(keepalive_s)
            return client
        await asyncio.sleep(min(next(pauses), max(0.0, deadline - time.monotonic())))
