"""The seeds' ``hud.environment``: what an environment author imports.

``from durable_rollouts.environment import Environment, Workspace, Mount`` is seed code with
``hud`` renamed. Re-exports only (loaded lazily); the room itself is ``envserver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .envserver import Answer, Capability, Environment, load_environment
    from .envserver.sandbox import Mount
    from .envserver.workspace import Workspace

__all__ = ["Answer", "Capability", "Environment", "Mount", "Workspace", "load_environment"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Answer": "durable_rollouts.envserver",
    "Capability": "durable_rollouts.envserver",
    "Environment": "durable_rollouts.envserver",
    "Mount": "durable_rollouts.envserver.sandbox",
    "Workspace": "durable_rollouts.envserver.workspace",
    "load_environment": "durable_rollouts.envserver",
})
