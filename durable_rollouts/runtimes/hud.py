"""HUDRuntime: a HUD-hosted environment, reached through a WebSocket tunnel behind a local port.

``acquire`` asks the HUD runtime gateway for a session of the task's environment (``POST
{runtime_url}/runtime/sessions`` with ``{"environment": NAME, "trace_id": T}``, which answers
``{"id": ...}``; ``T`` is derived from the rollout key), then listens on an ephemeral port of this machine's loopback and carries each accepted TCP
connection over its own WebSocket to ``{runtime_url}/runtime/tunnels/<id>`` (``ws``/``wss`` after
the gateway's scheme): bytes read from the socket go out as binary messages, every message
received is written back (text as UTF-8). ``release`` closes the listener and its tunnels and
deletes the session (``DELETE {runtime_url}/runtime/sessions/<id>``; gone already is fine).

The API key is ``$HUD_API_KEY``, sent as a bearer token on both calls and read again on every
worker: neither the provider spec nor the Endpoint (both in workflow history) carries it. The
listener lives in this process (locality ``process``); an acquire retried in this process reuses
its session, and one retried in another process (its worker died, perhaps between the create and
its answer) first asks for the key's sessions (``GET {runtime_url}/runtime/sessions?trace_id=T``)
and adopts the one it finds, deleting any other, before creating anything. That listing is not
among the calls HUD 0.6's own SDK makes: a gateway answering it 404, 405 or 501 gets a new
session, as before. A hosted env is already deployed, so no ``runtime_config`` can be honoured: any
set field is rejected. Imports models, errors and the provider base; ``httpx`` and
``websockets`` only inside methods.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError, ProviderError
from ..models import Endpoint, ProviderSpec, Task
from .base import DurableProvider, Locality, probe_ready

__all__ = ["HUDRuntime"]

log = logging.getLogger(__name__)

API_KEY_ENV = "HUD_API_KEY"
RUNTIME_URL_ENV = "HUD_RUNTIME_URL"
DEFAULT_RUNTIME_URL = "https://mcp.hud.ai"
DEFAULT_READY_TIMEOUT_S = 300.0
HTTP_TIMEOUT_S = 30.0
_CHUNK = 64 * 1024
_TRACE_NAMESPACE = uuid.UUID("6f1d6a52-3c47-4d0e-9a51-2b8f0c7e4d19")  # fixed: keys -> trace ids
_NO_LISTING = (404, 405, 501)  # a gateway without the session listing


def session_trace_id(key: str) -> str:
    """The trace id ``key``'s sessions are created under, and found by after a lost answer."""
    return str(uuid.uuid5(_TRACE_NAMESPACE, key))


@dataclass
class _Tunnel:
    """One key's local listener and the tunnels it carries."""

    session_id: str
    server: asyncio.Server | None = None
    conns: set[asyncio.StreamWriter] = field(default_factory=set)
    refused: BaseException | None = None  # the gateway's last refusal of a tunnel

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.conns:  # EOF ends each tunnel's outbound side, and so the tunnel
            writer.transport.abort()


# Live listeners of this process, by rollout key (the reason for locality "process").
_TUNNELS: dict[str, _Tunnel] = {}
# Gateways (base urls) that answered the session listing 404/405/501: not asked again.
_UNLISTED: set[str] = set()


class HUDRuntime(DurableProvider):
    """Run each rollout against a HUD-hosted environment.

    Args:
        environment: the HUD environment to open (default: each task's ``env``).
        runtime_url: the HUD runtime gateway (default ``$HUD_RUNTIME_URL``, else HUD's).
        ready_timeout: how long connecting through a fresh tunnel may take, in seconds.
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "hud"
    locality: ClassVar[Locality] = "process"
    honours: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        *,
        environment: str | None = None,
        runtime_url: str | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
        max_provisions_per_s: float | None = None,
        max_substrates: int | None = None,
    ) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.environment = environment
        self.runtime_url = runtime_url
        self.ready_timeout = float(ready_timeout)
        if runtime_url is not None:
            _ws_base(runtime_url)  # a malformed url fails here, not in the first rollout

    def __repr__(self) -> str:
        return f"HUDRuntime(environment={self.environment!r}, runtime_url={self._base()!r})"

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {"ready_timeout": self.ready_timeout}
        if self.environment is not None:
            options["environment"] = self.environment
        if self.runtime_url is not None:
            options["runtime_url"] = self.runtime_url
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> HUDRuntime:
        return cls(**options)

    def _base(self) -> str:
        base = self.runtime_url or os.environ.get(RUNTIME_URL_ENV) or DEFAULT_RUNTIME_URL
        return base.rstrip("/")

    @staticmethod
    def _api_key() -> str:
        key = os.environ.get(API_KEY_ENV)
        if not key:
            raise ConfigError(f"HUDRuntime needs the HUD API key in ${API_KEY_ENV}")
        return key

    # -- contract -----------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Open (or reuse) ``key``'s session of the hosted env and a local tunnel to it."""
        self.check_task(task)
        try:
            import websockets  # noqa: F401 - the tunnels need it: fail here, not in each one
        except ImportError as exc:
            raise ConfigError(
                "HUDRuntime needs the 'websockets' package: pip install 'durable-rollouts[hud]'"
            ) from exc
        base, api_key = self._base(), self._api_key()
        tunnel = _TUNNELS.get(key)
        if tunnel is None:
            session_id = await self._adopt_or_create(base, api_key, self.environment or task.env,
                                                     key)
            tunnel = _Tunnel(session_id)
            _TUNNELS[key] = tunnel
            ws_url = f"{_ws_base(base)}/runtime/tunnels/{session_id}"
            try:
                tunnel.server = await asyncio.start_server(
                    lambda r, w: _carry(tunnel, r, w, ws_url, api_key), "127.0.0.1", 0
                )
            except BaseException:
                await self._forget(key, base, api_key)
                raise
        assert tunnel.server is not None
        url = f"tcp://127.0.0.1:{tunnel.server.sockets[0].getsockname()[1]}"
        try:
            await probe_ready(url, None, self.ready_timeout, died=lambda: _refusal(tunnel))
        except BaseException:
            await self._forget(key, base, api_key)
            raise
        log.info("HUD session %s for %s tunnelled at %s", tunnel.session_id, key, url)
        return Endpoint(
            url=url,
            params={"ready_timeout": self.ready_timeout},
            provider=self.spec(),
            key=key,
            handle={"session_id": tunnel.session_id, "runtime_url": base},
        )

    async def release(self, endpoint: Endpoint) -> None:
        """Close the tunnel and delete the session (a no-op when it is already gone)."""
        tunnel = _TUNNELS.pop(endpoint.key, None)
        if tunnel is not None:
            tunnel.close()
        session_id = endpoint.handle.get("session_id")
        if session_id:
            base = str(endpoint.handle.get("runtime_url") or self._base())
            await self._delete_session(base, self._api_key(), str(session_id))

    async def _forget(self, key: str, base: str, api_key: str) -> None:
        """Undo a failed acquire: close the tunnel, delete its session (best effort)."""
        tunnel = _TUNNELS.pop(key, None)
        if tunnel is None:
            return
        tunnel.close()
        with suppress(Exception):
            await asyncio.shield(self._delete_session(base, api_key, tunnel.session_id))

    # -- the gateway's HTTP API -----------------------------------------------------------------

    async def _adopt_or_create(self, base: str, api_key: str, environment: str, key: str) -> str:
        """The session an earlier acquire of ``key`` made (others of the key are deleted), else
        a new one."""
        trace_id = session_trace_id(key)
        found = await self._sessions_of(base, api_key, trace_id)
        for extra in found[1:]:
            log.info("deleting HUD session %s: a second one of %s", extra, key)
            await self._delete_session(base, api_key, extra)
        if found:
            log.info("adopting HUD session %s of %s", found[0], key)
            return found[0]
        return await self._create_session(base, api_key, environment, trace_id)

    async def _sessions_of(self, base: str, api_key: str, trace_id: str) -> list[str]:
        """The ids of the sessions created under ``trace_id`` ([] when the gateway cannot list)."""
        if base in _UNLISTED:
            return []
        body = await _call("GET", f"{base}/runtime/sessions?trace_id={trace_id}", api_key, None,
                           missing=_NO_LISTING)
        if body is None:
            _UNLISTED.add(base)
            log.warning("HUD runtime gateway %s cannot list sessions: an acquire retried in "
                        "another process opens a new session", base)
        items = body.get("items") if isinstance(body, dict) else body
        # Only items that name the trace id: a gateway ignoring the filter must not hand us
        # another rollout's session.
        return [str(i["id"]) for i in items or [] if isinstance(i, dict) and i.get("id")
                and i.get("trace_id") == trace_id]

    async def _create_session(self, base: str, api_key: str, environment: str,
                              trace_id: str) -> str:
        body = await _call("POST", f"{base}/runtime/sessions", api_key,
                           {"environment": environment, "trace_id": trace_id})
        session_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(session_id, str) or not session_id:
            raise ProviderError(f"HUD runtime gateway {base} answered no session id: {body!r}")
        return session_id

    async def _delete_session(self, base: str, api_key: str, session_id: str) -> None:
        await _call("DELETE", f"{base}/runtime/sessions/{session_id}", api_key, None,
                    missing=(404,))


async def _call(method: str, url: str, api_key: str, payload: dict[str, Any] | None, *,
                missing: tuple[int, ...] = ()) -> Any:
    """One gateway call; ConfigError for what retrying cannot fix, ProviderError otherwise;
    None for a ``missing`` status."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
            resp = await client.request(
                method, url, json=payload, headers={"Authorization": f"Bearer {api_key}"}
            )
    except httpx.HTTPError as exc:
        raise ProviderError(
            f"cannot reach the HUD runtime gateway ({method} {url}): {exc}"
        ) from exc
    if resp.status_code in missing:
        return None
    if resp.status_code in (401, 403):
        raise ConfigError(f"the HUD runtime gateway refused ${API_KEY_ENV} ({resp.status_code})")
    if resp.is_error:
        what = f"{method} {url} failed with {resp.status_code}: {resp.text[:500]}"
        retryable = resp.status_code >= 500 or resp.status_code in (408, 429)
        raise (ProviderError if retryable else ConfigError)(f"HUD runtime gateway: {what}")
    return resp.json() if resp.content else None


def _ws_base(base: str) -> str:
    parts = urlsplit(base.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"HUDRuntime runtime_url {base!r}: expected http(s)://HOST[/PATH]")
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urlunsplit((scheme, parts.netloc, parts.path, "", ""))


async def _refusal(tunnel: _Tunnel) -> str | None:
    """Why the gateway refuses this session's tunnel (raised as ConfigError for the key)."""
    exc = tunnel.refused
    if exc is None:
        return None
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        raise ConfigError(
            f"the HUD runtime gateway refused ${API_KEY_ENV} for the tunnel ({status})"
        )
    return f"the HUD runtime gateway refused the tunnel of session {tunnel.session_id}: {exc}"


async def _carry(tunnel: _Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 ws_url: str, api_key: str) -> None:
    """Carry one accepted connection over its own WebSocket until either side closes."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    tunnel.conns.add(writer)
    try:
        async with connect(ws_url, additional_headers={"Authorization": f"Bearer {api_key}"},
                           max_size=None, open_timeout=HTTP_TIMEOUT_S) as ws:
            await _splice(reader, writer, ws)
    except InvalidStatus as exc:
        tunnel.refused = exc
        log.warning("HUD tunnel %s refused: %s", tunnel.session_id, exc)
    except (OSError, asyncio.TimeoutError, WebSocketException) as exc:
        log.info("HUD tunnel %s closed: %s", tunnel.session_id, exc)
    finally:
        tunnel.conns.discard(writer)
        writer.close()
        with suppress(Exception):
            await writer.wait_closed()


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: Any) -> None:
    async def outbound() -> None:
        while data := await reader.read(_CHUNK):
            await ws.send(data)

    async def inbound() -> None:
        async for message in ws:
            writer.write(message.encode() if isinstance(message, str) else message)
            await writer.drain()

    directions = [asyncio.ensure_future(outbound()), asyncio.ensure_future(inbound())]
    try:
        done, _ = await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in directions:
            task.cancel()
        await asyncio.gather(*directions, return_exceptions=True)
    for task in done:
        task.result()  # an error of the side that ended first
