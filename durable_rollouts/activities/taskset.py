"""Activities of the ``TasksetRun`` workflow: resolve a group's task, flush results to a store.

``resolve_group`` calls ``Taskset.resolve_task`` on the worker: the live taskset object when the
caller registered it in this process (the embedded worker), else an instance of its class built
from the import path. ``store_results`` writes a chunk of compact results as JSONL (a claim check,
through the ``ROLLOUTS_STORAGE`` driver) so continue-as-new carries references, not thousands of
results; ``load_rows`` reads a window of a large taskset's rows the same way.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path
from typing import Any

from temporalio import activity

from durable_rollouts.activities.failures import map_errors
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import RolloutResult, Task
from durable_rollouts.sdk.paths import rollouts_home
from durable_rollouts.temporal import row_pages, storage
from durable_rollouts.workflows.types import (
    ACT_LOAD_ROWS,
    ACT_RESOLVE,
    ACT_STORE_RESULTS,
    LoadRowsInput,
    ResolveGroupInput,
    ResultsRef,
    StoreResultsInput,
)

__all__ = ["ResultStore", "TasksetActivities", "register_taskset", "taskset_class_path"]

_LIVE: dict[tuple[str, str], Any] = {}


def taskset_class_path(taskset: Any) -> str | None:
    """``module:Class`` of a taskset whose ``resolve_task`` is overridden, else None (identity)."""
    from durable_rollouts.sdk.taskset import Taskset

    if type(taskset).resolve_task is Taskset.resolve_task:
        return None
    cls = type(taskset)
    return f"{cls.__module__}:{cls.__qualname__}"


def register_taskset(taskset: Any) -> None:
    """Let an in-process worker resolve with the caller's live taskset object."""
    path = taskset_class_path(taskset)
    if path is not None:
        _LIVE[(path, taskset.name)] = taskset


def _load_taskset(path: str, name: str) -> Any:
    live = _LIVE.get((path, name))
    if live is not None:
        return live
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import taskset class {path!r} on this worker: {err}") from err
    try:
        return obj(name)
    except TypeError as err:
        raise ConfigError(f"taskset class {path!r} cannot be built as {qualname}(name): {err}") from err


class ResultStore:
    """Chunks of RolloutResults as JSONL blobs in external storage, and a batch's rows: pages
    with a manifest (``temporal.row_pages``, written by the starter), or one JSONL blob of rows
    (earlier releases).

    Written through the ``ROLLOUTS_STORAGE`` driver (``rollouts-storage:`` uris, readable from any
    host with the bucket); ``file://`` chunks and row files of earlier releases are still read.
    """

    def __init__(self, root: Path | str | None = None, *, blobs: Any = None) -> None:
        self.root = Path(root) if root is not None else rollouts_home() / "results"
        self._blobs = blobs

    def _store(self) -> Any:
        if self._blobs is None:
            self._blobs = storage.blobs()
        return self._blobs

    def put(self, job_id: str, batch_index: int, chunk: int, results: list[RolloutResult]) -> ResultsRef:
        data = "".join(r.model_dump_json() + "\n" for r in results).encode()
        return ResultsRef(uri=self._store().put(data), count=len(results))

    @staticmethod
    def _read(uri: str) -> bytes:
        if uri.startswith(storage.BLOB_SCHEME):
            cached = _ROWS_CACHE.get(uri)
            if cached is None:
                cached = storage.blobs().get(uri)
                _ROWS_CACHE.clear() if len(_ROWS_CACHE) >= 4 else None
                _ROWS_CACHE[uri] = cached
            return cached
        return Path(uri.removeprefix("file://")).read_bytes()  # written by release <= f54ad67

    @staticmethod
    def get_rows(uri: str, start: int, stop: int) -> list[Task]:
        data = ResultStore._read(uri)
        if row_pages.is_manifest(data):  # paged rows, maybe several epochs: read the pages needed
            return row_pages.read(data, start, stop, ResultStore._read)
        lines = data.decode().splitlines()[start:stop]
        return [Task.model_validate_json(line) for line in lines]

    @staticmethod
    def get(ref: ResultsRef) -> list[RolloutResult]:
        text = ResultStore._read(ref.uri).decode()
        return [RolloutResult.model_validate(json.loads(line)) for line in text.splitlines() if line.strip()]


_ROWS_CACHE: dict[str, bytes] = {}  # blobs are content-addressed: a cached one never goes stale


class TasksetActivities:
    def __init__(self, results: ResultStore | None = None) -> None:
        self.results = results or ResultStore()

    def all(self) -> list[Any]:
        return [self.resolve_group, self.store_results, self.load_rows]

    @activity.defn(name=ACT_RESOLVE)
    async def resolve_group(self, inp: ResolveGroupInput) -> Task:
        with map_errors():
            if inp.taskset_class is None:
                return inp.task
            taskset = _load_taskset(inp.taskset_class, inp.taskset_name)
            return await taskset.aresolve(inp.task)

    @activity.defn(name=ACT_LOAD_ROWS)
    async def load_rows(self, inp: LoadRowsInput) -> list[Task]:
        return await asyncio.to_thread(self.results.get_rows, inp.uri, inp.start, inp.stop)

    @activity.defn(name=ACT_STORE_RESULTS)
    async def store_results(self, inp: StoreResultsInput) -> ResultsRef:
        return await asyncio.to_thread(self.results.put, inp.job_id, inp.batch_index, inp.chunk,
                                       inp.results)
