"""Substrates a one-step rollout's agent step keeps up for its own retry (process-local).

In layout 4 the agent step opens an in-process substrate itself (``AgentInput.open``), so the
workflow never learns its endpoint. When an attempt fails in a way Temporal retries (a model API
error, say), the step parks the opened substrate here under its key instead of tearing it down:
the retry, if it lands in this process, claims it and resumes the session from the latest
checkpoint, as a retry of a layout-3 agent step resumes the session the workflow recorded. A
retry elsewhere finds nothing here (the substrate lives in this process only) and, if the agent
had checkpointed, reports the substrate gone, so the workflow starts a fresh rollout attempt.

A parked substrate nobody claims within ``ttl_s`` (the retry went to another process, or the
workflow was cancelled between attempts) is torn down.
"""

from __future__ import annotations

import asyncio
import logging

from durable_rollouts.models import Opened
from durable_rollouts.sdk import steps
from durable_rollouts.sdk.providers import provider_from_spec

__all__ = ["PARKED", "ParkedSubstrates", "release_quietly"]

log = logging.getLogger(__name__)

# Longer than the agent step's retry backoff (at most 30 s between attempts, or a model API's
# Retry-After), short enough that an unclaimed substrate does not linger.
PARK_TTL_S = 300.0


async def release_quietly(opened: Opened) -> None:
    """End the session and release the substrate, best effort (a failure is only logged)."""
    try:
        await steps.teardown_with(opened.endpoint, opened.session,
                                  provider_from_spec(opened.endpoint.provider))
    except Exception as exc:  # noqa: BLE001 - nothing is left to report it to
        log.warning("teardown of %s failed: %s", opened.endpoint.key, exc)


class ParkedSubstrates:
    """Opened substrates by key, each torn down if not claimed within ``ttl_s``."""

    def __init__(self, ttl_s: float = PARK_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._parked: dict[str, tuple[Opened, asyncio.TimerHandle]] = {}
        self._expiring: set[asyncio.Task[None]] = set()

    def park(self, key: str, opened: Opened) -> None:
        """Keep ``opened`` for the next attempt of its step (replaces an older entry's timer)."""
        self.claim(key)
        timer = asyncio.get_running_loop().call_later(self.ttl_s, self._expire, key)
        self._parked[key] = (opened, timer)

    def claim(self, key: str) -> Opened | None:
        """The substrate parked under ``key`` (now the caller's), or None."""
        entry = self._parked.pop(key, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]

    def _expire(self, key: str) -> None:
        opened = self.claim(key)
        if opened is None:
            return
        log.info("releasing %s: no retry of its agent step claimed it in %.0f s", key, self.ttl_s)
        task = asyncio.get_running_loop().create_task(release_quietly(opened))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)


PARKED = ParkedSubstrates()
