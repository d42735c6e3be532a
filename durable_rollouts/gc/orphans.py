"""Judging gc candidates: which substrates outlived their rollout (:func:`find_orphans`).

A substrate is an orphan when

* its run deadline (``limits.run_timeout_s``) has passed, or
* it is a SubprocessRuntime child whose process is already dead, or
* it names a workflow and Temporal says that workflow is closed or unknown (needs a client), or
* it names no workflow (direct path) and its owner process on this host is gone (a
  SubprocessRuntime child's owner is the Python process that spawned it: once that is gone the
  child is re-parented to init or a subreaper).

``cautious`` (the worker's background sweep) never touches a substrate whose workflow is
running and leaves a container labelled with another Temporal server to that server's workers.
"Workflow not found" counts only for a container labelled with its own server, or once the owner
is gone: a substrate on this host (same Docker engine or ``$ROLLOUTS_HOME``) may belong to another
server. A deadline alone does not count there. Temporal is asked through
``durable_rollouts.temporal.jobs.workflow_closed``; gc itself never imports temporalio.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from durable_rollouts.gc.candidates import _Candidate, _candidates
from durable_rollouts.runtimes.labels import (
    LABEL_DEADLINE,
    LABEL_HOST,
    LABEL_KEY,
    LABEL_TEMPORAL,
    LABEL_WORKFLOW,
    server_id,
    workflow_for_key,
)
from durable_rollouts.temporal.jobs import NOT_FOUND, workflow_closed

Client = Any  # a temporalio Client (durable_rollouts.temporal.connection.connect_client)

__all__ = ["NOT_FOUND", "Orphan", "find_orphans"]

@dataclass
class Orphan:
    """One substrate that outlived its rollout."""

    kind: str  # the provider kind that placed it (``DurableProvider.kind``)
    key: str
    reason: str
    workflow_id: str = ""
    handle: dict[str, Any] = field(default_factory=dict)
    removed: bool = False


async def _workflow_closed(client: Client, workflow_id: str) -> str | None:
    """Why the workflow no longer needs its substrate, or None while it is running."""
    return await workflow_closed(client, workflow_id)


def _foreign(cand: _Candidate, client: Client) -> bool:
    """True when the substrate is labelled with another Temporal server or namespace."""
    server = cand.labels.get(LABEL_TEMPORAL, "")
    return bool(server) and server != server_id(client)


async def _reason(
    cand: _Candidate, workflow_id: str, client: Client | None, now: float, host: str
) -> str | None:
    """Why ``cand`` is an orphan under the rules of ``rollouts gc`` (None: it is not)."""
    deadline = cand.labels.get(LABEL_DEADLINE, "")
    if deadline and float(deadline) < now:
        return "run deadline passed"
    if cand.dead:
        return cand.dead
    if workflow_id and client is not None:
        if _foreign(cand, client):
            return None  # another Temporal server's: this one cannot tell
        return await _workflow_closed(client, workflow_id)
    if not workflow_id and cand.labels.get(LABEL_HOST) == host and cand.owner_gone:
        return "owner process gone"
    return None


async def _cautious_reason(cand: _Candidate, workflow_id: str, client: Client | None) -> str | None:
    """The sweep's rules: a running workflow keeps its substrate whatever else holds; another
    server's container is left alone; an unknown workflow (maybe another server's) or none
    counts only once the owner is gone."""
    if client is not None and _foreign(cand, client):
        return None
    if workflow_id and client is not None:
        closed = await _workflow_closed(client, workflow_id)
        if closed != NOT_FOUND or cand.labels.get(LABEL_TEMPORAL):
            return closed  # None while running
    if cand.dead:
        return cand.dead
    if cand.owner_gone:
        return f"{NOT_FOUND} and owner process gone" if workflow_id else "owner process gone"
    return None


async def find_orphans(
    client: Client | None = None,
    *,
    prefix: str = "",
    now: float | None = None,
    cautious: bool = False,
) -> list[Orphan]:
    """Every labelled substrate on this host that outlived its rollout (see the module docstring).

    Args:
        client: a Temporal client used to ask whether each substrate's Rollout workflow is
            closed; without one only deadlines and dead owner processes count.
        prefix: only substrates whose rollout key starts with this (e.g. ``job-<id>``).
        now: the current time (tests).
        cautious: the background sweep's stricter rules (module docstring).
    """
    now = time.time() if now is None else now
    host = socket.gethostname()
    candidates = await asyncio.to_thread(_candidates)
    orphans: list[Orphan] = []
    for cand in candidates:
        key = cand.labels.get(LABEL_KEY, "")
        if not key.startswith(prefix):
            continue
        workflow_id = cand.labels.get(LABEL_WORKFLOW, "") or workflow_for_key(key)
        if cautious:
            reason = await _cautious_reason(cand, workflow_id, client)
        else:
            reason = await _reason(cand, workflow_id, client, now, host)
        if reason is not None:
            orphans.append(Orphan(cand.kind, key, reason, workflow_id, dict(cand.handle)))
    return orphans
