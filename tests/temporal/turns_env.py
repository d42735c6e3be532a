"""The counting env's ``echo`` plus a ``turns`` MCP tool: an agent's tool call is the env's own side effect.

``turn(log, rollout, turn, by)`` appends ``<rollout> <turn> <by>`` to ``log`` from the env's own
process, so a crash test counts the tool calls an agent made where they happen, in the env
(``agent_helpers.TurnsAgent`` with ``tool=True``; ``by`` is the calling worker's pid). Served as
``counting``, with ``echo``'s evidence of every setup and grade (``counting_env``).
"""

from __future__ import annotations

from counting_env import env
from fastmcp import FastMCP

tools = FastMCP("turns")


@tools.tool
def turn(log: str, rollout: str, turn: int, by: int) -> int:
    """Record one turn's side effect; returns the turn."""
    with open(log, "a") as fh:
        fh.write(f"{rollout} {turn} {by}\n")
    return turn


env.mcp(tools, name="turns")
