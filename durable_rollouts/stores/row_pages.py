"""A batch's rows as pages in ``ROLLOUTS_STORAGE``, visited ``epochs`` times (issue #39, item 2).

``Taskset.run(..., epochs=N, seed=S)`` and ``Taskset.start(...)`` (and any taskset above
``INLINE_ROWS``) write the rows as pages while reading the taskset: at most ``PAGE_ROWS`` rows and
about ``PAGE_BYTES`` per page, each its own blob, and a small manifest (:class:`RowPages`: the
pages' uris and row counts, ``epochs`` and ``seed``) names them. The batch's input carries only
the manifest's uri (``rows_ref``) and ``total_rows = rows x epochs``; the workflow loads windows of
positions by activity as it always did (``load_rows``), and :func:`read` turns a window into rows
reading only the pages it touches. So no workflow, payload or activity result holds the whole
taskset, however long it is.

Position ``p`` is row ``order(e)[p % rows]`` of epoch ``e = p // rows``. With ``seed`` None the
order is the taskset's; else each epoch visits the rows in its own order drawn from
``(seed, e)``: the pages in a shuffled order, each page's rows shuffled (a block shuffle, so a
window of positions reads one or two pages). A row of epoch ``e >= 1`` gets the slug
``<slug>-e<e>``: its rollouts (whose ids derive from the slug) and its group are new ones, while
``Run.group_index`` stays ``0..group-1``. Pure apart from :func:`put_pages`' writes; the reader
gets a ``read_blob`` function.

A live job that takes further rows (``LiveJob.add``, ``Taskset.start(..., job=live)``) reads a
:class:`RowChain` instead: its earlier rows, then each addition's manifest, one after another.
Positions keep their rows as the chain grows; the ``k``-th addition's rows get the slug suffix
``-a<k>``, so a taskset added twice runs as new rollouts and groups.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from ..models import Task

__all__ = ["MAX_EPOCHS", "PAGE_BYTES", "PAGE_ROWS", "ChainPart", "RowChain", "RowPages", "check_epochs",
           "extend", "is_manifest", "manifest_bytes", "order_seed", "put_pages", "read", "read_any",
           "store_rows"]

PAGE_ROWS = 1000
PAGE_BYTES = 1 << 20
MAX_EPOCHS = 1_000_000
_MARK = b'{"kind":"row-pages"'
_CHAIN_MARK = b'{"kind":"row-chain"'


class RowPages(BaseModel):
    """The manifest of a batch's paged rows (stored as one JSON blob; ``rows_ref`` is its uri)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["row-pages"] = "row-pages"
    rows: int = Field(ge=1)  # rows of one epoch
    counts: list[int]  # rows per page
    pages: list[str]  # each page's uri: JSONL rows
    epochs: int = Field(default=1, ge=1)
    seed: int | None = None  # None: every epoch in the taskset's order

    @property
    def total(self) -> int:
        return self.rows * self.epochs


def check_epochs(epochs: object, seed: object, *, streamed: bool = False) -> None:
    """ConfigError (one line) for an ``epochs`` or ``seed`` a batch cannot run; ``epochs=None``
    (rows until ``job.close()``) only for a ``streamed`` batch."""
    if epochs is None:
        if streamed:
            epochs = 1
        else:
            raise ConfigError("epochs=None (rows until job.close()) needs a streamed job: "
                              "Taskset.start(...); Taskset.run takes a whole number of epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or not 1 <= epochs <= MAX_EPOCHS:
        raise ConfigError(f"epochs={epochs!r}: use a whole number from 1 to {MAX_EPOCHS:,}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed={seed!r}: use a whole number (or None: the taskset's order)")


def put_pages(rows: Iterable[Task], put: Callable[[bytes], str], *, epochs: int = 1,
              seed: int | None = None) -> RowPages:
    """Write ``rows`` as pages with ``put`` (bytes -> uri), one page in memory at a time, and
    then the manifest; returns the manifest (its uri is ``put(manifest_bytes(...))``)."""
    pages: list[str] = []
    counts: list[int] = []
    lines: list[bytes] = []
    size = 0
    for row in rows:
        line = row.model_dump_json().encode() + b"\n"
        if lines and (len(lines) >= PAGE_ROWS or size + len(line) > PAGE_BYTES):
            pages.append(put(b"".join(lines)))
            counts.append(len(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line)
    if lines:
        pages.append(put(b"".join(lines)))
        counts.append(len(lines))
    if not pages:
        raise ConfigError("the taskset has no rows")
    return RowPages(rows=sum(counts), counts=counts, pages=pages, epochs=epochs, seed=seed)


def manifest_bytes(manifest: RowPages) -> bytes:
    return manifest.model_dump_json().encode()


def store_rows(rows: Iterable[Task], put: Callable[[bytes], str], *, epochs: int = 1,
               seed: int | None = None) -> str:
    """Write ``rows`` as pages and their manifest with ``put``; the manifest's uri."""
    return put(manifest_bytes(put_pages(rows, put, epochs=epochs, seed=seed)))


def order_seed(epochs: int | None, seed: int | None) -> int | None:
    """The seed of the epochs' orders: ``seed``, else 0 when there are several epochs or they
    are open-ended (None with one epoch: the taskset's order)."""
    return 0 if seed is None and epochs != 1 else seed


def is_manifest(data: bytes) -> bool:
    """Paged rows (a manifest or a chain of them), not the one JSONL blob of earlier releases."""
    return data.startswith(_MARK) or data.startswith(_CHAIN_MARK)


class ChainPart(BaseModel):
    """One run of positions of a :class:`RowChain`: ``total`` positions of the blob ``ref`` (a
    manifest, or the JSONL rows of earlier releases), their slugs suffixed with ``suffix``."""

    model_config = ConfigDict(extra="forbid")

    ref: str
    total: int = Field(ge=1)
    suffix: str = ""


class RowChain(BaseModel):
    """A live job's rows after further rows were added: its parts' positions, in order."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["row-chain"] = "row-chain"
    parts: list[ChainPart]

    @property
    def total(self) -> int:
        return sum(p.total for p in self.parts)


def extend(base: bytes | None, base_ref: str, base_total: int, added_ref: str, added_total: int) -> RowChain:
    """The chain of a job's rows (``base``: the blob at ``base_ref`` with ``base_total``
    positions; a chain already, or not) followed by ``added_total`` positions of ``added_ref``,
    whose slugs get ``-a<k>`` for the k-th addition."""
    if base is not None and base.startswith(_CHAIN_MARK):
        parts = list(RowChain.model_validate_json(base).parts)
    else:
        parts = [ChainPart(ref=base_ref, total=base_total)]
    return RowChain(parts=[*parts, ChainPart(ref=added_ref, total=added_total, suffix=f"a{len(parts)}")])


def _order(manifest: RowPages, epoch: int) -> tuple[list[int], list[int]]:
    """(page order, row offset where each of those pages starts in the epoch)."""
    order = list(range(len(manifest.pages)))
    if manifest.seed is not None:
        random.Random(f"{manifest.seed}:{epoch}").shuffle(order)
    starts, at = [], 0
    for page in order:
        starts.append(at)
        at += manifest.counts[page]
    return order, starts


def _within(manifest: RowPages, epoch: int, page: int) -> list[int]:
    """The order of one page's rows in ``epoch``."""
    offsets = list(range(manifest.counts[page]))
    if manifest.seed is not None:
        random.Random(f"{manifest.seed}:{epoch}:{page}").shuffle(offsets)
    return offsets


def read_any(data: bytes, start: int, stop: int, read_blob: Callable[[str], bytes]) -> list[Task]:
    """Rows ``start..stop`` of any rows blob: a chain, a manifest, or JSONL rows (earlier releases)."""
    if data.startswith(_CHAIN_MARK):
        return _read_chain(RowChain.model_validate_json(data), start, stop, read_blob)
    if data.startswith(_MARK):
        return read(data, start, stop, read_blob)
    return [Task.model_validate_json(line) for line in data.decode().splitlines()[max(start, 0):stop]]


def _read_chain(chain: RowChain, start: int, stop: int, read_blob: Callable[[str], bytes]) -> list[Task]:
    out: list[Task] = []
    at = 0
    for part in chain.parts:
        lo, hi = max(start, at), min(stop, at + part.total)
        if lo < hi:
            rows = read_any(read_blob(part.ref), lo - at, hi - at, read_blob)
            out.extend(r.model_copy(update={"slug": f"{r.slug}-{part.suffix}"}) if part.suffix else r
                       for r in rows)
        at += part.total
    return out


def read(data: bytes, start: int, stop: int, read_blob: Callable[[str], bytes]) -> list[Task]:
    """The rows at positions ``start..stop`` of the manifest ``data`` (clipped to its total),
    reading each page they touch once."""
    manifest = RowPages.model_validate_json(data)
    stop = min(stop, manifest.total)
    wanted: list[tuple[int, int, int]] = []  # (epoch, page, offset in the page) per position
    orders: dict[int, tuple[list[int], list[int]]] = {}
    shuffles: dict[tuple[int, int], list[int]] = {}
    for position in range(max(start, 0), stop):
        epoch, k = divmod(position, manifest.rows)
        if epoch not in orders:
            orders[epoch] = _order(manifest, epoch)
        order, starts = orders[epoch]
        slot = bisect.bisect_right(starts, k) - 1
        page = order[slot]
        if (epoch, page) not in shuffles:
            shuffles[(epoch, page)] = _within(manifest, epoch, page)
        wanted.append((epoch, page, shuffles[(epoch, page)][k - starts[slot]]))
    lines: dict[int, list[bytes]] = {}
    out = []
    for epoch, page, offset in wanted:
        if page not in lines:
            lines[page] = read_blob(manifest.pages[page]).splitlines()
        row = Task.model_validate_json(lines[page][offset])
        out.append(row if epoch == 0 else row.model_copy(update={"slug": f"{row.slug}-e{epoch}"}))
    return out
