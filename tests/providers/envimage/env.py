"""The environment baked into the provider tests' image (and served by the SSH/Modal tests)."""

from __future__ import annotations

import os

from durable_rollouts.envserver import Environment

env = Environment(name="substrate-probe", version="1.0.0")


@env.template()
async def count_letter(word: str = "strawberry", letter: str = "r"):
    """Score 1.0 when the answer contains the right count."""
    answer = yield f"How many '{letter}' in '{word}'?"
    yield 1.0 if str(word.count(letter)) in (answer or "") else 0.0


@env.template()
async def echo_size(blob: str = ""):
    """Report the length of a (large) argument: task data travels over the socket, not argv."""
    answer = yield f"size={len(blob)}"
    yield 1.0 if answer == str(len(blob)) else 0.0


@env.template()
async def whoami():
    """Report where the env runs (pid/uid/hostname), so tests can tell substrates apart."""
    yield f"pid={os.getpid()} uid={os.getuid()} host={os.uname().nodename}"
    yield 1.0
