"""``EnvClient.manifest``: the ``hello`` reply as HUD's client shapes it (seed 002).

``session_id``, ``protocol_version`` (the server's own; ``hud/1.0`` for a HUD server, whose
reply names none), ``server_info`` (the env's name and version) and ``bindings`` as
:class:`Capability` objects, the addresses the environment
published (``EnvClient.binding(name)`` gives the tunnelled ones). ``EnvClient.hello()`` returns
it, as HUD's does; it also reads as the raw reply dict (``manifest["bindings"]``,
``manifest.get("protocol")``), the form ``hello()`` returned before. Pure data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..envserver.capability import Capability
from ..protocol import EnvInfo

__all__ = ["Manifest"]


@dataclass(frozen=True)
class Manifest:
    """What ``hello`` returned, as HUD's ``Manifest``."""

    session_id: str
    protocol_version: str
    server_info: EnvInfo
    bindings: list[Capability]
    reply: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The hello reply as the server sent it."""

    def __getitem__(self, key: str) -> Any:
        return self.reply[key]

    def __contains__(self, key: object) -> bool:
        return key in self.reply

    def __iter__(self) -> Iterator[str]:
        return iter(self.reply)

    def get(self, key: str, default: Any = None) -> Any:
        """``reply.get``: the raw reply's member, as a dict reads."""
        return self.reply.get(key, default)

    def keys(self) -> Any:
        return self.reply.keys()

    @classmethod
    def from_hello(cls, result: dict[str, Any], session_id: str, env: EnvInfo,
                   bindings: list[dict[str, Any]]) -> Manifest:
        return cls(session_id=session_id, protocol_version=str(result.get("protocol") or "hud/1.0"),
                   server_info=env, bindings=[_capability(b) for b in bindings], reply=result)


def _capability(binding: dict[str, Any]) -> Capability:
    try:
        return Capability.from_manifest(binding)
    except Exception:  # a binding our constructors would refuse: kept as the server sent it
        return Capability.model_construct(**{k: binding.get(k) for k in ("name", "protocol", "url")},
                                          params=dict(binding.get("params") or {}))
