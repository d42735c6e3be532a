"""A job's results and rows as claim checks: chunks of JSONL and row pages in the blob store.

The ``TasksetRun`` workflow's activities write here (``store_results``, the rows of a large
batch) and every reader of a job reads here (``temporal.jobs``, resume): one format, one module,
below both. The store is the registered one (``stores.blobs``: the ``ROLLOUTS_STORAGE`` driver
once the Temporal layer is loaded), so any host with the bucket reads what another wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..models import ResultsRef, RolloutResult, Task
from ..paths import rollouts_home
from . import row_pages
from .blobs import BlobStore, default_blobs

__all__ = ["ResultStore"]


class ResultStore:
    """Chunks of RolloutResults and a batch's rows, as JSONL blobs in external storage.

    Written through the ``ROLLOUTS_STORAGE`` driver (``rollouts-storage:`` uris, readable from any
    host with the bucket); ``file://`` chunks and row files of earlier releases are still read.
    """

    def __init__(self, root: Path | str | None = None, *, blobs: BlobStore | None = None) -> None:
        self.root = Path(root) if root is not None else rollouts_home() / "results"
        self._blobs = blobs

    def _store(self) -> BlobStore:
        if self._blobs is None:
            self._blobs = default_blobs()
        return self._blobs

    def put(self, job_id: str, batch_index: int, chunk: int, results: list[RolloutResult]) -> ResultsRef:
        data = "".join(r.model_dump_json() + "\n" for r in results).encode()
        return ResultsRef(uri=self._store().put(data), count=len(results))

    @staticmethod
    def _read(uri: str) -> bytes:
        if not uri.startswith("file://"):
            cached = _ROWS_CACHE.get(uri)
            if cached is None:
                cached = default_blobs().get(uri)
                _ROWS_CACHE.clear() if len(_ROWS_CACHE) >= 4 else None
                _ROWS_CACHE[uri] = cached
            return cached
        return Path(uri.removeprefix("file://")).read_bytes()  # written by release <= f54ad67

    @staticmethod
    def get_rows(uri: str, start: int, stop: int) -> list[Task]:
        """Rows ``start:stop`` of a batch: from paged rows (``row_pages``: a manifest, maybe
        several epochs; only the pages the window touches are read) or one JSONL blob (earlier
        releases)."""
        return row_pages.read_any(ResultStore._read(uri), start, stop, ResultStore._read)

    def extend_rows(self, base_ref: str | None, base_rows: list[Task], base_total: int, added_ref: str,
                    added_total: int) -> str:
        """Store the chain of a batch's rows so far (``base_ref``, else the inline ``base_rows``,
        paged first) and ``added_total`` positions of ``added_ref`` (``row_pages.extend``).
        Returns the chain's uri."""
        store = self._store()
        base = None
        if base_ref is None:
            base_ref = row_pages.store_rows(base_rows, store.put)
        else:
            base = ResultStore._read(base_ref)
        chain = row_pages.extend(base, base_ref, base_total, added_ref, added_total)
        return store.put(chain.model_dump_json().encode())

    @staticmethod
    def get(ref: ResultsRef) -> list[RolloutResult]:
        text = ResultStore._read(ref.uri).decode()
        return [RolloutResult.model_validate(json.loads(line)) for line in text.splitlines() if line.strip()]


_ROWS_CACHE: dict[str, bytes] = {}  # blobs are content-addressed: a cached one never goes stale
