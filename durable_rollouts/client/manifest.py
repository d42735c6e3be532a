"""``EnvClient.manifest``: the ``hello`` reply as HUD's client shapes it (seed 002).

``session_id``, ``protocol_version`` (the server's own; ``hud/1.0`` for a HUD server, whose
reply names none), ``server_info`` (the env's name and version) and ``bindings`` as
:class:`Capability` objects, the addresses the environment
published (``EnvClient.binding(name)`` gives the tunnelled ones). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    @classmethod
    def from_hello(cls, result: dict[str, Any], session_id: str, env: EnvInfo,
                   bindings: list[dict[str, Any]]) -> Manifest:
        return cls(session_id=session_id, protocol_version=str(result.get("protocol") or "hud/1.0"),
                   server_info=env, bindings=[_capability(b) for b in bindings])


def _capability(binding: dict[str, Any]) -> Capability:
    try:
        return Capability.from_manifest(binding)
    except Exception:  # a binding our constructors would refuse: kept as the server sent it
        return Capability.model_construct(**{k: binding.get(k) for k in ("name", "protocol", "url")},
                                          params=dict(binding.get("params") or {}))
