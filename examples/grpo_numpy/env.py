"""The task the example trains on: add two small numbers, answer with one digit.

``add(seed)`` draws ``a`` and ``b`` from ``0..MAX_TERM`` with ``random.Random(seed)``, asks
"What is a + b?" and grades 1.0 for the exact sum, else 0.0. A policy that guesses among the
``2 * MAX_TERM + 1`` possible answers scores about 0.2; one that learned every sum scores 1.0.

Serve it by hand with ``rollouts serve examples/grpo_numpy/env.py`` and
``rollouts task start add --args '{"seed": 3}'``.
"""

from __future__ import annotations

import random

from durable_rollouts.envserver import Environment

MAX_TERM = 2  # a, b in 0..2: nine problems, answers 0..4

env = Environment(name="sums", version="1.0.0")


def problem(seed: int) -> tuple[int, int]:
    """The two terms row ``seed`` asks about."""
    rng = random.Random(seed)
    return rng.randint(0, MAX_TERM), rng.randint(0, MAX_TERM)


@env.template(description="Add two numbers from 0 to 2; answer with one digit.")
async def add(seed: int = 0):
    a, b = problem(seed)
    answer = yield f"What is {a} + {b}? Answer with one digit."
    yield 1.0 if str(answer or "").strip() == str(a + b) else 0.0


tasks = [add(seed=i) for i in range(8)]
