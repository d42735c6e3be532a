"""Activities of a streamed ``TasksetRun``: write a stream page, write the closed stream's manifest.

Both write under named keys (``temporal.stream_pages``): a retried or replayed write stores the
same content again, so each is idempotent.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from durable_rollouts.temporal.stream_pages import StreamStore
from durable_rollouts.workflows.stream_paging import (
    ACT_STREAM_MANIFEST,
    ACT_STREAM_PAGE,
    StreamManifestInput,
    StreamPageInput,
)

__all__ = ["StreamPageActivities"]


class StreamPageActivities:
    def all(self) -> list[Any]:
        return [self.write_page, self.write_manifest]

    @activity.defn(name=ACT_STREAM_PAGE)
    async def write_page(self, inp: StreamPageInput) -> int:
        """Store page ``inp.page``; returns how many groups it holds."""
        await StreamStore(inp.job_id, inp.batch_index).put_page(inp.page, inp.groups)
        return len(inp.groups)

    @activity.defn(name=ACT_STREAM_MANIFEST)
    async def write_manifest(self, inp: StreamManifestInput) -> None:
        m = inp.manifest
        await StreamStore(m.job_id, m.batch_index).put_manifest(m)
