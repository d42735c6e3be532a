"""The coding example's taskset: one row per buggy module in ``starter/``."""

from __future__ import annotations

from pathlib import Path

from durable_rollouts.envserver import load_environment

env = load_environment(str(Path(__file__).with_name("env.py")))
tasks = [env.templates["fix_bug"](module="mathutils")]
