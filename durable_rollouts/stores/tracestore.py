"""A claim-check store for traces: full traces live in external storage, workflows carry a TraceRef.

Traces are written through the ``ROLLOUTS_STORAGE`` driver (``durable_rollouts.temporal.storage``,
the same store temporalio offloads large payloads to), so any host with the bucket reads them,
for as long as the bucket keeps them, independent of Temporal's history retention. The TraceRef's
uri is then a ``rollouts-storage:`` claim; ``file://`` refs written by earlier releases are still
read. Imports models, paths and ``stores.blobs`` (the store is registered there by the Temporal
layer, so this module never imports temporalio).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..models import Trace, TraceRef
from ..paths import rollouts_home
from .blobs import default_blobs

__all__ = ["TraceStore"]


class TraceStore:
    """Traces in external storage; old ``file://`` traces read from disk.

    Args:
        root: where legacy relative trace paths resolve (default ``$ROLLOUTS_HOME/traces``).
        blobs: a ``stores.blobs.BlobStore`` (default: ``default_blobs()``, the ``ROLLOUTS_STORAGE``
            store once the Temporal layer is loaded).
    """

    def __init__(self, root: Path | str | None = None, *, blobs: Any = None) -> None:
        self.root = Path(root) if root is not None else rollouts_home() / "traces"
        self._blobs = blobs

    @property
    def blobs(self) -> Any:
        if self._blobs is None:
            self._blobs = default_blobs()
        return self._blobs

    def put(self, trace: Trace) -> TraceRef:
        """Store ``trace`` (assigning a trace id if it has none) and return its claim check."""
        if not trace.trace_id:
            trace.trace_id = uuid.uuid4().hex
        data = trace.model_dump_json().encode()
        return TraceRef(uri=self.blobs.put(data), size=len(data))

    async def aput(self, trace: Trace) -> TraceRef:
        """``put`` for async callers: the event loop is not blocked while the store writes."""
        if not trace.trace_id:
            trace.trace_id = uuid.uuid4().hex
        data = trace.model_dump_json().encode()
        return TraceRef(uri=await self.blobs.aput(data), size=len(data))

    def get(self, ref: TraceRef | str) -> Trace:
        """Read the trace behind ``ref`` (a TraceRef or its uri)."""
        uri = ref.uri if isinstance(ref, TraceRef) else ref
        if uri.startswith("rollouts-storage:"):
            try:
                return Trace.model_validate_json(self.blobs.get(uri))
            except RuntimeError as err:  # the driver's "cannot read": same family as a lost file
                raise OSError(str(err)) from err
        parsed = urlparse(uri)
        if parsed.scheme not in ("file", ""):
            raise ValueError(f"TraceStore reads rollouts-storage: and file:// uris, not {uri!r}")
        path = Path(unquote(parsed.path)) if parsed.scheme else self.root / uri
        return Trace.model_validate_json(path.read_bytes())
