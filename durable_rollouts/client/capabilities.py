"""Client-side openers for an environment's capabilities (ssh workspace, mcp tools, raw tcp).

``await open_capability(client, name)`` looks the binding up on a connected
:class:`~durable_rollouts.client.envclient.EnvClient` (whose url already points at a loopback forwarder
that tunnels through ``tunnel.open``) and returns a ready client:

- ``ssh/*``: an ``asyncssh.SSHClientConnection`` authenticated with the binding's client key
  (content, never a file) and pinned to the binding's host key; ``conn.run(cmd)`` runs in the
  workspace. Close with ``conn.close()`` (or ``async with``).
- ``mcp/*``: a connected ``fastmcp.Client``; close with ``await client.close()``.
- anything else (cdp, rfb, a plain tcp port): an ``(asyncio.StreamReader, StreamWriter)`` pair.

Users reach this through ``await client.open(name)`` (``EnvClient.open``; ``run.open`` is the
same), which caches the handle per client and closes it with the client. An mcp binding without
a ``transport`` param (HUD's plain ``Capability(...)`` publishes none) goes by its url scheme.
A refused or immediately dropped connection is retried a few times with exponential backoff; a
name the environment does not publish raises :class:`CapabilityNotFoundError` listing what exists.
Imports asyncssh/fastmcp lazily; never ``envserver``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..backoff import retry
from ..errors import ConfigError

__all__ = [
    "BindingSource",
    "CapabilityNotFoundError",
    "close_capability",
    "find_binding",
    "open_capability",
    "protocol_family",
]


class BindingSource(Protocol):
    """What an opener needs of a connected client (``EnvClient`` has it; no import cycle)."""

    bindings: list[dict[str, Any]]

    def binding(self, name: str) -> dict[str, Any]: ...


class CapabilityNotFoundError(ConfigError, KeyError):
    """The environment publishes no capability with this name (the message lists what exists)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown capability"


def protocol_family(binding: dict[str, Any]) -> str:
    """``"ssh"`` for ``ssh/2``, ``"mcp"`` for ``mcp/2025-11-25`` ..."""
    return str(binding.get("protocol", "")).split("/")[0].lower()


def find_binding(bindings: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The binding called ``name`` (or, failing that, the only one of protocol family ``name``).

    Raises:
        CapabilityNotFoundError: nothing matches; the message lists the published capabilities.
    """
    for binding in bindings:
        if binding.get("name") == name:
            return binding
    family = [b for b in bindings if name in (b.get("protocol"), protocol_family(b))]
    if len(family) == 1:
        return family[0]
    have = ", ".join(f"{b.get('name')} ({b.get('protocol')})" for b in bindings) or "none"
    raise CapabilityNotFoundError(
        f"the environment has no capability {name!r}; it publishes: {have}"
    )


async def open_capability(
    client: BindingSource,
    name: str,
    *,
    attempts: int = 4,
    backoff_s: float = 0.25,
    timeout_s: float = 30.0,
) -> Any:
    """Open the capability ``name`` of a connected env client and return a ready client for it.

    Args:
        client: a connected ``EnvClient`` (its bindings carry tunnelled loopback urls).
        name: the capability name (or a protocol family such as ``"ssh"`` when unambiguous).
        attempts: how many times a refused / dropped connection is tried.
        backoff_s: the first retry delay (doubled each retry).
        timeout_s: the limit of one connection attempt.

    Raises:
        CapabilityNotFoundError: the environment has no such capability.
        OSError / asyncssh errors: the capability stayed unreachable after all attempts.
    """
    binding = client.binding(find_binding(client.bindings, name)["name"])
    family = protocol_family(binding)
    opener = {"ssh": _open_ssh, "mcp": _open_mcp}.get(family, _open_tcp)
    return await retry(lambda: asyncio.wait_for(opener(binding), timeout_s), attempts=attempts,
                       first_delay_s=backoff_s, transient=_is_transient)


async def close_capability(handle: Any) -> None:
    """Close whatever :func:`open_capability` returned (best effort)."""
    with contextlib.suppress(Exception):
        if isinstance(handle, tuple):
            handle[1].close()
            return
        closer = getattr(handle, "close", None)
        if closer is None:
            return
        result = closer()
        if asyncio.iscoroutine(result):  # fastmcp Client.close()
            await result
        waiter = getattr(handle, "wait_closed", None)  # asyncssh connections
        if waiter is not None:
            await asyncio.wait_for(waiter(), 5)


def _address(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"capability url {url!r} has no host")
    return parts.hostname, parts.port or default_port


def _is_transient(exc: BaseException) -> bool:
    import asyncssh

    if isinstance(exc, (asyncssh.PermissionDenied, asyncssh.HostKeyNotVerifiable, ConfigError)):
        return False
    if isinstance(exc, (OSError, EOFError, asyncio.TimeoutError, asyncssh.ConnectionLost,
                        asyncssh.DisconnectError, asyncio.IncompleteReadError)):
        return True
    # fastmcp reports any transport failure while connecting as this RuntimeError (unchained,
    # wrapping its own httpx fork's errors), so the message is the only thing to go by.
    return isinstance(exc, RuntimeError) and str(exc).startswith("Client failed to connect")


async def _open_ssh(binding: dict[str, Any]) -> Any:
    import asyncssh

    params = binding.get("params") or {}
    host, port = _address(binding["url"], 22)
    user = params.get("user") or urlsplit(binding["url"]).username or "agent"
    options: dict[str, Any] = {
        "username": user,
        "config": None,
        "agent_path": None,
        "password": None,
        "kbdint_auth": False,
    }
    if params.get("client_key"):
        options["client_keys"] = [asyncssh.import_private_key(params["client_key"])]
    elif params.get("client_key_path"):  # a HUD binding on a shared filesystem
        options["client_keys"] = [params["client_key_path"]]
    if params.get("host_pubkey"):
        host_key = asyncssh.import_public_key(params["host_pubkey"])
        options["known_hosts"] = ([host_key], [], [])
    else:
        options["known_hosts"] = None
    return await asyncssh.connect(host, port, **options)


async def _open_mcp(binding: dict[str, Any]) -> Any:
    from fastmcp import Client
    from fastmcp.client.transports import SSETransport, StreamableHttpTransport

    params = binding.get("params") or {}
    headers = {}
    if params.get("auth_token"):
        headers["Authorization"] = f"Bearer {params['auth_token']}"
    # A binding without a transport (HUD's own client infers one too) goes by its url scheme.
    web = urlsplit(binding["url"]).scheme in ("http", "https")
    transport = params.get("transport") or ("streamable-http" if web else "websocket")
    if transport == "sse":
        client = Client(SSETransport(binding["url"], headers=headers))
    elif transport == "streamable-http" and web:
        client = Client(StreamableHttpTransport(binding["url"], headers=headers))
    else:
        raise ConfigError(f"mcp capability {binding.get('name')!r}: transport {transport!r} over "
                          f"{binding['url']!r} is not supported (use streamable-http or sse)")
    try:
        await client.__aenter__()
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client


async def _open_tcp(binding: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = _address(binding["url"], 0)
    if not port:
        raise ConfigError(f"capability url {binding['url']!r} has no port")
    return await asyncio.open_connection(host, port)
