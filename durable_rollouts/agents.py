"""The seeds' ``hud.agents``: the agent base class and the bundled agents.

Re-exports only (loaded lazily); the room is ``sdk.agents`` (and ``sdk.openai_agent``).
HUD's ``create_agent(model)`` resolves models through hud.ai's gateway and is not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .sdk.agents import Agent, FailAgent, FixedAgent, SleepAgent, TableAgent
    from .sdk.openai_agent import OpenAIChatAgent

__all__ = ["Agent", "FailAgent", "FixedAgent", "OpenAIChatAgent", "SleepAgent", "TableAgent"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Agent": "durable_rollouts.sdk.agents",
    "FailAgent": "durable_rollouts.sdk.agents",
    "FixedAgent": "durable_rollouts.sdk.agents",
    "OpenAIChatAgent": "durable_rollouts.sdk.openai_agent",
    "SleepAgent": "durable_rollouts.sdk.agents",
    "TableAgent": "durable_rollouts.sdk.agents",
})
