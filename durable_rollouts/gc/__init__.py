"""Garbage collection of substrates whose rollout is over: ``rollouts gc [--dry-run]``.

Holds the two entry points and re-exports the public API of the modules that do the work:

* :mod:`.labels`: the owner labels every substrate carries (:func:`owner_labels`) and the
  workflow id a rollout key names (:func:`workflow_for_key`);
* :mod:`.candidates`: every substrate this host's providers list (``list_substrates()`` of each
  provider class: Docker containers by label, SubprocessRuntime children by their state files);
* :mod:`.orphans`: which of them outlived their rollout (:func:`find_orphans`, with the rules
  and the ``cautious`` ones of the sweep);
* :mod:`.removal`: removing them through the provider that placed them (``reap()``), each
  re-checked right before (:func:`collect`).

Generic over providers: nothing here branches on a provider's kind.

The CLI calls :func:`gc` (``rollouts gc [--dry-run]``) and prints :func:`format_orphans`; the
worker runs :func:`sweep` (``rollouts worker --gc-every SECONDS``). Reaches Temporal only
through ``durable_rollouts.temporal`` (it never imports temporalio, workflows or activities).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

# Besides the public API, a few internals stay importable from here (tests use them).
from durable_rollouts.gc.candidates import _Candidate, _candidates  # noqa: F401
from durable_rollouts.gc.orphans import NOT_FOUND, Orphan, _cautious_reason, find_orphans  # noqa: F401
from durable_rollouts.gc.removal import _remove_checked, collect  # noqa: F401
from durable_rollouts.runtimes.labels import (  # noqa: F401
    LABEL_DEADLINE,
    LABEL_HOST,
    LABEL_JOB,
    LABEL_KEY,
    LABEL_OWNER,
    LABEL_TEMPORAL,
    LABEL_WORKFLOW,
    job_from_workflow_id,
    owner_labels,
    server_id,
    workflow_for_key,
)

Client = Any  # a temporalio Client

# The LABEL_* names and owner_labels stay importable from here; sdk.labels owns them.
__all__ = [
    "Orphan",
    "collect",
    "find_orphans",
    "format_orphans",
    "gc",
    "owner_labels",
    "sweep",
    "workflow_for_key",
]

log = logging.getLogger(__name__)

FIRST_SWEEP_DELAY_S = 5.0  # the worker's first sweep: soon after start, not at once


async def gc(temporal: Any = None, *, dry_run: bool = False, prefix: str = "") -> list[Orphan]:
    """What ``rollouts gc [--dry-run]`` runs: :func:`collect` with a Temporal client.

    Args:
        temporal: a Temporal ``Client``, an address, or None (``$ROLLOUTS_TEMPORAL_ADDRESS``,
            else the embedded dev server, which holds the workflows of embedded runs).
        dry_run: only list what would be removed.
        prefix: only substrates whose rollout key starts with this.
    """
    from durable_rollouts.temporal.connection import as_client

    client = await as_client(temporal)
    return await collect(client, dry_run=dry_run, prefix=prefix)


async def sweep(client: Client, every_s: float, *, first_delay_s: float | None = None) -> None:
    """Collect orphans (``cautious``) every ``every_s`` seconds until cancelled: the worker's gc.

    The first sweep runs after ``first_delay_s`` (default ``min(every_s, 5)``). Never raises:
    a failed sweep is one warning and the next one runs on time. Logs one INFO line per
    removed orphan. ``every_s`` of 0 (or infinite) returns at once.
    """
    if not 0 < every_s < float("inf"):
        return
    delay = min(every_s, FIRST_SWEEP_DELAY_S) if first_delay_s is None else first_delay_s
    while True:
        await asyncio.sleep(delay)
        delay = every_s
        try:
            orphans = await collect(client, cautious=True)
        except Exception as exc:  # noqa: BLE001 - the sweep must never end the worker
            log.warning("gc sweep failed (next in %gs): %s: %s", every_s, type(exc).__name__, exc)
            continue
        for orphan in orphans:
            if orphan.removed:
                log.info("gc: %s", _line(orphan, "removed"))


def _line(o: Orphan, verb: str) -> str:
    where = o.handle.get("container") or f"pid {o.handle.get('pid')}"
    return f"{verb} {o.kind} {where} (key {o.key}): {o.reason}"


def format_orphans(orphans: list[Orphan], *, dry_run: bool = False) -> str:
    """One line per orphan, for the CLI."""
    if not orphans:
        return "no orphaned substrates"
    verb = "would remove" if dry_run else "removed"
    return "\n".join(_line(o, verb if (dry_run or o.removed) else "FAILED to remove") for o in orphans)
