"""``Capability``: a service an environment exposes next to its control channel, and the small
``CapabilityHost`` protocol that capability helpers (``workspace``, ``mcp``) declare themselves on.

The named constructors (``Capability.ssh/mcp/cdp/rfb/robot``) build the bindings of the
well-known protocols with HUD v6's protocol strings, parameter names and default ports, so a
binding published by either side reads the same on the other. ``from_manifest`` reads a binding
dict back (one from our ``hello`` or from a HUD server's) without changing it.

Pure pydantic plus ``errors``: ``environment`` imports it, and so do the capability modules,
which therefore never import ``environment`` (no import cycle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError

__all__ = ["KNOWN_PROTOCOLS", "Capability", "CapabilityHost"]


@dataclass(frozen=True)
class _Family:
    """What a protocol family's url may look like, and how shorthand is completed."""

    protocol: str  # the full protocol string the named constructor publishes
    schemes: tuple[str, ...]  # url schemes a binding of this family may use
    default_port: int | None = None  # filled in when the url names none


_FAMILIES: dict[str, _Family] = {
    "ssh": _Family("ssh/2", ("ssh",), 22),
    "mcp": _Family("mcp/2025-11-25", ("http", "https", "ws", "wss")),
    "cdp": _Family("cdp/1.3", ("ws", "wss", "http", "https"), 9222),
    "rfb": _Family("rfb/3.8", ("rfb", "vnc", "tcp"), 5900),
    "openpi": _Family("openpi/0", ("ws", "wss"), 9091),
    "filetracking": _Family("filetracking/1", ("tcp",)),
    "tcp": _Family("tcp", ("tcp",)),
}

KNOWN_PROTOCOLS: tuple[str, ...] = tuple(sorted(_FAMILIES))
"""The protocol families ``Capability.from_manifest`` reads (the part before ``/``)."""

_WEB_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _checked_url(url: Any, family: str, name: str, *, default_port: int | None = None,
                 shorthand: str | None = None) -> str:
    """``url`` checked against ``family``'s schemes; ``host[:port]`` shorthand gets the
    ``shorthand`` scheme, and a missing port ``default_port`` (both only when given)."""
    spec = _FAMILIES[family]
    what = f"{spec.protocol} capability {name!r}"
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what}: url must be a non-empty string, not {url!r}")
    if shorthand is not None and "://" not in url:
        url = f"{shorthand}://{url}"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in spec.schemes:
        raise ConfigError(f"{what}: url {url!r} must start with one of "
                          f"{', '.join(s + '://' for s in spec.schemes)}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{what}: url {url!r} has a bad port") from None
    if not parts.hostname:
        raise ConfigError(f"{what}: url {url!r} names no host")
    if port is not None or default_port is None:
        return url
    user = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return urlunsplit((parts.scheme, f"{user}{host}:{default_port}", parts.path, parts.query,
                       parts.fragment))


class Capability(BaseModel):
    """A service the environment exposes next to the control channel (ssh, mcp, a raw tcp port...).

    Its manifest form (``manifest()``: ``{name, protocol, url, params}``) is what ``hello``
    publishes as a binding. Build one with a named constructor (``Capability.mcp(name="tools",
    url="http://127.0.0.1:8040/mcp")``), or directly for a protocol of your own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    protocol: str
    url: str
    params: dict[str, Any] = Field(default_factory=dict)

    def __call__(self, name: str | None = None) -> Capability:
        """This capability, published as ``name`` (HUD's ``ws.capability("shell")``)."""
        return self if name in (None, self.name) else self.model_copy(update={"name": name})

    def manifest(self) -> dict[str, Any]:
        """The binding dict sent to clients."""
        return self.model_dump()

    def to_manifest(self) -> dict[str, Any]:
        """The binding dict sent to clients (HUD's name for :meth:`manifest`)."""
        return self.manifest()

    @classmethod
    def from_manifest(cls, binding: Mapping[str, Any]) -> Capability:
        """The capability a binding dict describes: ``from_manifest(c.manifest()) == c``.

        Reads the bindings of every protocol family in :data:`KNOWN_PROTOCOLS`, ours or
        published by a HUD v6 server, unchanged (keys other than name/protocol/url/params are
        ignored).

        Raises:
            ConfigError: not a binding dict, an unknown protocol family, or a url whose scheme
                that family does not use.
        """
        if not isinstance(binding, Mapping):
            raise ConfigError(f"a capability binding must be a dict, not {type(binding).__name__}")
        name, protocol = binding.get("name"), binding.get("protocol")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"capability binding {dict(binding)!r} has no name")
        if not isinstance(protocol, str) or not protocol:
            raise ConfigError(f"capability {name!r} has no protocol")
        family = protocol.split("/", 1)[0].lower()
        if family not in _FAMILIES:
            raise ConfigError(f"capability {name!r} has unknown protocol {protocol!r} "
                              f"(known: {', '.join(KNOWN_PROTOCOLS)})")
        url = _checked_url(binding.get("url"), family, name)
        params = binding.get("params")
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"capability {name!r}: params must be a dict, not {params!r}")
        return cls(name=name, protocol=protocol, url=url, params=dict(params or {}))

    # -- the well-known protocols --------------------------------------------------------------

    @classmethod
    def ssh(
        cls,
        *,
        name: str = "shell",
        url: str,
        host_pubkey: str,
        user: str = "agent",
        client_key: str | None = None,
        client_key_path: str | os.PathLike[str] | None = None,
        shell: str = "bash",
        cwd: str | None = None,
        isolation: Literal["bwrap", "none", "refused"] | None = None,
        network: bool | None = None,
        timeout_s: float | None = None,
        process_connections: bool = False,
    ) -> Capability:
        """``ssh/2``: an ssh server taking public-key auth (``url``: ``ssh://host[:22]``).

        Args:
            host_pubkey: the server's public host key (OpenSSH form); clients pin it.
            user: the login name.
            client_key: the client's private key *content* (works across hosts/containers).
            client_key_path: a private key file instead (only where client and server share
                a filesystem).
            shell: the remote shell (``bash``, ``powershell``, ``cmd``).
            cwd: the directory commands start in, as the session sees it.
            isolation: the sandbox commands run in (``bwrap`` or ``none``), as granted;
                ``refused``: no sandbox works here, so commands are refused.
            network: whether commands reach the network (ours; HUD clients ignore it).
            timeout_s: commands running longer are killed (ours; HUD clients ignore it).
            process_connections: the server binds connections to processes (HUD's extension).
        """
        params: dict[str, Any] = {"user": user, "host_pubkey": host_pubkey, "shell": shell}
        optional = {"client_key": client_key, "cwd": cwd, "isolation": isolation,
                    "network": network, "timeout_s": timeout_s,
                    "client_key_path": os.fspath(client_key_path) if client_key_path else None}
        params.update({k: v for k, v in optional.items() if v is not None})
        if process_connections:
            params["process_connections"] = True
        url = _checked_url(url, "ssh", name, default_port=22, shorthand="ssh")
        return cls(name=name, protocol=_FAMILIES["ssh"].protocol, url=url, params=params)

    @classmethod
    def mcp(
        cls,
        *,
        name: str = "tools",
        url: str,
        auth_token: str | None = None,
        transport: Literal["streamable-http", "sse", "websocket"] | None = None,
    ) -> Capability:
        """``mcp/2025-11-25``: an MCP server over http(s) (or ws(s)); never stdio.

        ``transport`` defaults to ``streamable-http`` for http(s) urls and ``websocket`` for
        ws(s); ``auth_token`` is sent as a bearer token.
        """
        url = _checked_url(url, "mcp", name, shorthand="http")
        scheme = urlsplit(url).scheme.lower()
        web = scheme in ("http", "https")
        if transport is None:
            transport = "streamable-http" if web else "websocket"
        if transport not in ("streamable-http", "sse", "websocket"):
            raise ConfigError(f"mcp capability {name!r}: unknown transport {transport!r}")
        if (transport == "websocket") == web:
            wanted = "ws:// or wss://" if transport == "websocket" else "http:// or https://"
            raise ConfigError(f"mcp capability {name!r}: transport {transport!r} needs a "
                              f"{wanted} url, not {url!r}")
        url = _checked_url(url, "mcp", name, default_port=_WEB_PORTS[scheme])
        params: dict[str, Any] = {"transport": transport}
        if auth_token is not None:
            params["auth_token"] = auth_token
        return cls(name=name, protocol=_FAMILIES["mcp"].protocol, url=url, params=params)

    @classmethod
    def cdp(cls, *, name: str = "browser", url: str, target_id: str | None = None) -> Capability:
        """``cdp/1.3``: a Chromium DevTools endpoint (``http://host:9222`` or a ``ws://`` url);
        ``target_id`` picks one page target."""
        url = _checked_url(url, "cdp", name, default_port=9222, shorthand="ws")
        params = {"target_id": target_id} if target_id is not None else {}
        return cls(name=name, protocol=_FAMILIES["cdp"].protocol, url=url, params=params)

    @classmethod
    def rfb(cls, *, name: str = "screen", url: str, display: int = 0,
            password: str | None = None) -> Capability:
        """``rfb/3.8``: a VNC server. A url without a port gets ``5900 + display``."""
        if isinstance(display, bool) or not isinstance(display, int) or display < 0:
            raise ConfigError(f"rfb capability {name!r}: display must be an int >= 0, "
                              f"not {display!r}")
        url = _checked_url(url, "rfb", name, default_port=5900 + display, shorthand="rfb")
        params: dict[str, Any] = {"display": display}
        if password is not None:
            params["password"] = password
        return cls(name=name, protocol=_FAMILIES["rfb"].protocol, url=url, params=params)

    @classmethod
    def robot(cls, *, name: str = "robot", url: str,
              contract: dict[str, Any] | None = None) -> Capability:
        """``openpi/0``: a robot action/observation loop over a websocket (port 9091 by default).

        ``contract`` is the env's self-description (robot type, control rate, features) that
        travels verbatim in the binding.
        """
        url = _checked_url(url, "openpi", name, default_port=9091, shorthand="ws")
        return cls(name=name, protocol=_FAMILIES["openpi"].protocol, url=url,
                   params={"contract": dict(contract or {})})


class CapabilityHost(Protocol):
    """What ``add_workspace`` / ``add_mcp`` need of an ``Environment``."""

    source: str | None

    def add_capability(self, capability: Capability) -> Any: ...

    def initialize(self, fn: Callable[[], Any]) -> Any: ...

    def shutdown(self, fn: Callable[[], Any]) -> Any: ...
