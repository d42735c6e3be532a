"""MCP calculator example: the environment publishes a fastmcp calculator as an ``mcp`` capability.

The agent sees the calculator's tools (``add``, ``subtract``, ``multiply``, ``divide``) through
the control channel's tunnel and answers an arithmetic question; the grade is a numeric match.
"""

from __future__ import annotations

from fastmcp import FastMCP

from durable_rollouts.envserver import Environment
from durable_rollouts.graders import numeric_match

calculator = FastMCP("calculator")


@calculator.tool
def add(a: float, b: float) -> float:
    """Return a + b."""
    return a + b


@calculator.tool
def subtract(a: float, b: float) -> float:
    """Return a - b."""
    return a - b


@calculator.tool
def multiply(a: float, b: float) -> float:
    """Return a * b."""
    return a * b


@calculator.tool
def divide(a: float, b: float) -> float:
    """Return a / b (b must not be 0)."""
    if b == 0:
        raise ValueError("division by zero")
    return a / b


env = Environment(name="mcp_calc", version="1.0.0")
env.mcp(calculator, name="calculator")


@env.template(description="Compute (a + b) * c with the calculator tools.")
async def arithmetic(a: float = 17, b: float = 25, c: float = 3):
    answer = yield (
        f"Use the calculator tools to compute ({a:g} + {b:g}) * {c:g}. "
        "Reply with the number only."
    )
    yield numeric_match(answer or "", (a + b) * c, tolerance=1e-6)
