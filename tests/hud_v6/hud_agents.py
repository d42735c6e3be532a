"""HUD v6 agents of the tests: subclasses of ``hud.agents.base.Agent``, as a HUD user writes them.

They read ``run.prompt_text`` / ``run.client`` (a ``hud.eval.Run``) and put the answer in
``run.trace.content``. Imported by the HUD tests, by ``rollouts run --agent hud_agents.py:...``
and rebuilt by workers from ``module:Class`` plus ``dump()``.
"""

from __future__ import annotations

import re

from hud.agents.base import Agent
from hud.agents.types import AgentConfig
from hud.types import Step


class LetterCounter(Agent):
    """Answers the quickstart's "How many 'r's are in 'strawberry'?" by counting."""

    async def __call__(self, run) -> None:
        match = re.search(r"How many '(.)'s are in '([^']*)'", run.prompt_text)
        run.record(Step(source="agent", messages=[]))
        run.trace.content = str(match.group(2).count(match.group(1))) if match else "?"


class ToolCaller(Agent):
    """Calls the env's MCP tool ``do_thing(x=42)`` through ``run.client.open("tools")``."""

    async def __call__(self, run) -> None:
        tools = await run.client.open("tools")
        result = await tools.call_tool("do_thing", {"x": 42})
        run.trace.content = " ".join(getattr(block, "text", "") for block in result.content)


class Unreachable(Agent):
    """Fails the way an agent whose model is down fails."""

    async def __call__(self, run) -> None:
        raise RuntimeError("model unreachable")


class SuffixConfig(AgentConfig):
    suffix: str = ""


class Suffixed(Agent[SuffixConfig]):
    """Answers ``config.suffix``: its config must reach the worker that rebuilds it."""

    config_cls = SuffixConfig

    async def __call__(self, run) -> None:
        run.trace.content = self.config.suffix
