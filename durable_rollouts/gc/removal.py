"""Removing orphans (:func:`collect`): each by the provider that placed it.

Each orphan is re-checked right before removal (the provider's ``reap`` asks, under whatever lock
it keeps) and dropped from the result when it turned out to be in use again. Generic over
providers: ``reap`` does the provider-specific part.
"""

from __future__ import annotations

import logging
from typing import Any

from durable_rollouts.gc.orphans import Orphan, _workflow_closed, find_orphans
from durable_rollouts.runtimes import provider_classes
from durable_rollouts.runtimes.base import Substrate

__all__ = ["collect"]

log = logging.getLogger(__name__)

Client = Any  # a temporalio Client


async def _still_orphan(orphan: Orphan, client: Client | None, cautious: bool) -> bool:
    """Re-check just before removal: the workflow was not (re)started meanwhile (e.g. a resumed
    rollout reusing a live substrate by key)."""
    asked = cautious or orphan.reason.startswith("workflow ")
    if orphan.workflow_id and client is not None and asked:
        return await _workflow_closed(client, orphan.workflow_id) is not None
    return True


async def _remove_checked(orphan: Orphan, client: Client | None, cautious: bool) -> bool:
    """Remove ``orphan`` if it still is one; False when it turned out to be in use again."""
    owner = {cls.kind: cls for cls in provider_classes()}.get(orphan.kind)
    if owner is None:
        return False
    substrate = Substrate(orphan.kind, {}, dict(orphan.handle), alive=True)
    orphan.removed = await owner.reap(substrate, lambda: _still_orphan(orphan, client, cautious))
    return orphan.removed


async def collect(
    client: Client | None = None,
    *,
    dry_run: bool = False,
    prefix: str = "",
    cautious: bool = False,
) -> list[Orphan]:
    """Find orphans and remove them (containers force-removed, process groups killed).

    Args:
        client: Temporal client for the workflow check (see :func:`find_orphans`).
        dry_run: only list what would be removed.
        prefix: only substrates whose rollout key starts with this.
        cautious: the background sweep's stricter rules (:mod:`.orphans`).

    Returns:
        The orphans found (less those in use again by the time of removal); ``removed`` is
        True for each one that was removed.
    """
    orphans = await find_orphans(client, prefix=prefix, cautious=cautious)
    if dry_run:
        return orphans
    kept = []
    for orphan in orphans:
        try:
            if await _remove_checked(orphan, client, cautious):
                kept.append(orphan)
        except Exception as exc:  # noqa: BLE001 - one stuck substrate must not stop the rest
            log.warning("gc: could not remove %s %s: %s", orphan.kind, orphan.key, exc)
            kept.append(orphan)
    return kept
