"""A small fastmcp server the capability tests serve as their ``mcp`` capability."""

from __future__ import annotations

from fastmcp import FastMCP


def calculator() -> FastMCP:
    """A fastmcp server with one tool, ``add(a, b)``."""
    server = FastMCP("calc")

    @server.tool
    def add(a: float, b: float) -> float:
        """Return a + b."""
        return a + b

    return server
