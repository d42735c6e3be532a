"""Stream pages: where a batch's acknowledged groups go, so its state stays bounded.

A streamed batch (``StreamOptions.page_size`` set) keeps in its workflow state only the groups
that are running, or delivered and not yet acknowledged by every registered consumer. Once every
registered consumer has acknowledged ``page_size`` groups past the oldest kept one, those groups
are written by an activity as page ``n`` (groups ``[n * page_size, (n + 1) * page_size)``) to
``ROLLOUTS_STORAGE`` under a key named by the job, the batch and ``n``: the content is the
groups' JSON lines, so writing a page again (a retried activity, a replay) writes the same bytes.
The index is implicit: page ``n`` spans ``page_span(n)``; only the last page, written when the
batch closes, may be short. When the batch closes it also writes a manifest (page size, groups
delivered, every consumer's cursor); acknowledgements after that are stored next to it.

Pure pydantic plus the stream's models: safe inside the workflow sandbox (the activities and the
client's reader live in ``activities.stream_pages`` and ``temporal.stream_pages``).
"""

from __future__ import annotations

from pydantic import Field

from durable_rollouts.models import StrictModel
from durable_rollouts.workflows.stream import FinishedGroup, PolicyRef

__all__ = [
    "ACT_STREAM_MANIFEST",
    "ACT_STREAM_PAGE",
    "PATCH_PAGES",
    "KeptState",
    "StreamManifest",
    "StreamManifestInput",
    "StreamPageInput",
    "cursor_key",
    "manifest_key",
    "page_key",
    "page_span",
]

ACT_STREAM_PAGE = "stream_page"
ACT_STREAM_MANIFEST = "stream_manifest"
PATCH_PAGES = "stream-pages"  # the workflow.patched() id of paging (runs before it never page)
PATCH_WAIT_HANDOVER = "stream-wait-handover"  # ``stream_wait`` says a run continuing as new


def _prefix(job_id: str, batch_index: int) -> str:
    return f"streams/{job_id}/b{batch_index}/"


def page_key(job_id: str, batch_index: int, page: int) -> str:
    """The storage key of page ``page`` of a batch's stream."""
    return f"{_prefix(job_id, batch_index)}page-{page:08d}.jsonl"


def manifest_key(job_id: str, batch_index: int) -> str:
    """The storage key of a closed batch's stream manifest."""
    return f"{_prefix(job_id, batch_index)}manifest.json"


def cursor_key(job_id: str, batch_index: int, consumer: str) -> str:
    """The storage key of ``consumer``'s cursor once the batch has closed."""
    return f"{_prefix(job_id, batch_index)}cursors/{consumer}.json"


def page_span(page: int, page_size: int, delivered: int) -> tuple[int, int]:
    """``[first, end)`` sequence numbers of page ``page`` (the last one may be short)."""
    first = page * page_size
    return first, min(first + page_size, delivered)


class StreamPageInput(StrictModel):
    """One page to write: the groups ``[page * page_size, ...)`` in delivery order."""

    job_id: str
    batch_index: int = 0
    page: int = Field(ge=0)
    groups: list[FinishedGroup]


class StreamManifest(StrictModel):
    """What a closed batch's stream left in storage: its pages and every consumer's cursor."""

    job_id: str
    batch_index: int = 0
    page_size: int = Field(ge=1)
    delivered: int = Field(ge=0)  # groups delivered: pages = ceil(delivered / page_size)
    cursors: dict[str, int] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)
    policy: PolicyRef | None = None

    @property
    def pages(self) -> int:
        return -(-self.delivered // self.page_size)


class StreamManifestInput(StrictModel):
    manifest: StreamManifest


class KeptState(StrictModel):
    """The ``stream_kept`` query: how much of the stream the workflow holds right now."""

    kept_groups: int  # delivered groups in workflow state (not yet paged)
    base: int  # sequence number of the oldest kept group (every one before it is in a page)
    pages: int  # pages written
    page_size: int | None = None
    state_bytes: int  # the stream state's JSON size (what continue-as-new carries of it)
