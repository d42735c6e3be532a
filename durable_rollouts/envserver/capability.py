"""``Capability``: a service an environment exposes next to its control channel, and the small
``CapabilityHost`` protocol that capability helpers (``workspace``, ``mcp``) declare themselves on.

Pure pydantic: ``environment`` imports it, and so do the capability modules, which therefore never
import ``environment`` (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Capability", "CapabilityHost"]


class Capability(BaseModel):
    """A service the environment exposes next to the control channel (ssh, mcp, a raw tcp port...).

    Its manifest form (``model_dump()``) is what ``hello`` publishes as a binding.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    protocol: str
    url: str
    params: dict[str, Any] = Field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """The binding dict sent to clients."""
        return self.model_dump()


class CapabilityHost(Protocol):
    """What ``add_workspace`` / ``add_mcp`` need of an ``Environment``."""

    source: str | None

    def add_capability(self, capability: Capability) -> Any: ...

    def initialize(self, fn: Callable[[], Any]) -> Any: ...

    def shutdown(self, fn: Callable[[], Any]) -> Any: ...
