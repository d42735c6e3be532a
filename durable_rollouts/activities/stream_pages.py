"""Activities of a streamed ``TasksetRun``: write a stream page, write the closed stream's manifest.

Both write under named keys (``temporal.stream_pages.StreamStore``, handed in by the worker, which
sits above the Temporal client layer): a retried or replayed write stores the same content again,
so each is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from temporalio import activity

from durable_rollouts.workflows.stream_paging import (
    ACT_STREAM_MANIFEST,
    ACT_STREAM_PAGE,
    StreamManifestInput,
    StreamPageInput,
)

__all__ = ["StreamPageActivities"]


class PageStore(Protocol):
    """Where a batch's stream pages and manifest go (``temporal.stream_pages.StreamStore``)."""

    async def put_page(self, page: int, groups: Any) -> None: ...

    async def put_manifest(self, manifest: Any) -> None: ...


class StreamPageActivities:
    """``store(job_id, batch_index)``: the page store of one batch."""

    def __init__(self, store: Callable[[str, int], PageStore]) -> None:
        self.store = store

    def all(self) -> list[Any]:
        return [self.write_page, self.write_manifest]

    @activity.defn(name=ACT_STREAM_PAGE)
    async def write_page(self, inp: StreamPageInput) -> int:
        """Store page ``inp.page``; returns how many groups it holds."""
        await self.store(inp.job_id, inp.batch_index).put_page(inp.page, inp.groups)
        return len(inp.groups)

    @activity.defn(name=ACT_STREAM_MANIFEST)
    async def write_manifest(self, inp: StreamManifestInput) -> None:
        m = inp.manifest
        await self.store(m.job_id, m.batch_index).put_manifest(m)
