"""The seeds' ``hud.capabilities``: ``Capability`` (what an environment publishes) plus the
client helpers that open one from a rollout's bindings.

Re-exports only (loaded lazily); the rooms are ``envserver.capability`` and ``sdk.capabilities``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .client.capabilities import (
        CapabilityNotFoundError,
        close_capability,
        find_binding,
        open_capability,
    )
    from .envserver.capability import Capability

__all__ = ["Capability", "CapabilityNotFoundError", "close_capability", "find_binding",
           "open_capability"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Capability": "durable_rollouts.envserver.capability",
    "CapabilityNotFoundError": "durable_rollouts.client.capabilities",
    "close_capability": "durable_rollouts.client.capabilities",
    "find_binding": "durable_rollouts.client.capabilities",
    "open_capability": "durable_rollouts.client.capabilities",
})
