"""The MCP calculator example's taskset."""

from __future__ import annotations

from pathlib import Path

from durable_rollouts.envserver import load_environment

env = load_environment(str(Path(__file__).with_name("env.py")))
arithmetic = env.templates["arithmetic"]
tasks = [arithmetic(a=17, b=25, c=3), arithmetic(a=1.5, b=2.5, c=10)]
