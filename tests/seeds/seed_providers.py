"""Module-level provider callables: importable by ``module:attr``, as workers elsewhere need.

``EVENTS`` notes what the provider did in this process; with ``$SEED_EVENTS_FILE`` set each
event is also appended there with the pid that did it (a worker process's events).
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path

from durable_rollouts import Runtime
from durable_rollouts.envserver import load_environment, serving

GROUP_STATE = Path(__file__).parent / "envs" / "group_state.py"
EVENTS: list[str] = []


def _note(event: str) -> None:
    EVENTS.append(event)
    if os.environ.get("SEED_EVENTS_FILE"):
        with open(os.environ["SEED_EVENTS_FILE"], "a") as out:
            out.write(f"{os.getpid()} {event}\n")


@asynccontextmanager
async def serve_group_state(task):
    """Seed 001's contract: (task) -> async context manager yielding a Runtime."""
    env = load_environment(str(GROUP_STATE), fresh=True)
    async with serving(env) as server:
        _note(f"enter {task.id}")
        yield Runtime(server.url)
        _note(f"exit {task.id}")
