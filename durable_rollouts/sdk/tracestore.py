"""A claim-check store for traces: full traces live in files, workflows carry a small TraceRef.

Writes are atomic (temporary file + rename), so a reader never sees half a trace and a retried
agent step simply replaces the file of the same trace id. Imports only models and paths.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..models import Trace, TraceRef
from .paths import atomic_write, rollouts_home, safe_name

__all__ = ["TraceStore"]


class TraceStore:
    """Traces as JSON files under ``root`` (default ``$ROLLOUTS_HOME/traces``).

    Args:
        root: the directory; created on first write.
    """

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else rollouts_home() / "traces"

    def put(self, trace: Trace) -> TraceRef:
        """Write ``trace`` (assigning a trace id if it has none) and return its claim check."""
        if not trace.trace_id:
            trace.trace_id = uuid.uuid4().hex
        self.root.mkdir(parents=True, exist_ok=True)
        path = (self.root / f"{safe_name(trace.trace_id)}.json").resolve()
        data = trace.model_dump_json().encode()
        atomic_write(path, data)
        return TraceRef(uri=path.as_uri(), size=len(data))

    def get(self, ref: TraceRef | str) -> Trace:
        """Read the trace behind ``ref`` (a TraceRef or its ``file://`` uri)."""
        uri = ref.uri if isinstance(ref, TraceRef) else ref
        parsed = urlparse(uri)
        if parsed.scheme not in ("file", ""):
            raise ValueError(f"TraceStore reads file:// uris only, not {uri!r}")
        path = Path(unquote(parsed.path)) if parsed.scheme else Path(uri)
        return Trace.model_validate_json(path.read_bytes())
