"""Paged rows and epochs (``temporal/row_pages.py``, issue #39 item 2), with an in-memory store."""

from __future__ import annotations

import hashlib

import pytest

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.stores import row_pages
from durable_rollouts.stores.row_pages import (
    check_epochs,
    is_manifest,
    manifest_bytes,
    put_pages,
    read,
)


class Store:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.reads: list[str] = []

    def put(self, data: bytes) -> str:
        uri = "mem:" + hashlib.sha256(data).hexdigest()
        self.blobs[uri] = data
        return uri

    def get(self, uri: str) -> bytes:
        self.reads.append(uri)
        return self.blobs[uri]


def rows(n: int) -> list[Task]:
    return [Task(env="e", id="t", args={"i": i}) for i in range(n)]


def test_each_epoch_visits_every_row_once_in_its_own_seeded_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_pages, "PAGE_ROWS", 10)
    store = Store()
    manifest = put_pages(rows(35), store.put, epochs=3, seed=7)
    assert manifest.counts == [10, 10, 10, 5] and manifest.total == 105
    data = manifest_bytes(manifest)
    assert is_manifest(data) and not is_manifest(rows(1)[0].model_dump_json().encode())
    out = read(data, 0, 1000, store.get)  # clipped to the total
    assert len(out) == 105
    epochs = [[r.args["i"] for r in out[e * 35:(e + 1) * 35]] for e in range(3)]
    assert all(sorted(order) == list(range(35)) for order in epochs)
    assert len({tuple(order) for order in epochs}) == 3 and epochs[0] != list(range(35))
    assert {r.slug for r in out[:35]} == {r.slug for r in rows(35)}  # the first epoch: as given
    assert {r.slug for r in out[70:]} == {f"{r.slug}-e2" for r in rows(35)}
    assert len({r.slug for r in out}) == 105  # new rollout ids in every epoch
    again = put_pages(rows(35), Store().put, epochs=3, seed=7)
    assert [r.args for r in read(manifest_bytes(again), 0, 105, store.get)] == [r.args for r in out]
    other = put_pages(rows(35), store.put, epochs=3, seed=8)
    assert [r.args for r in read(manifest_bytes(other), 0, 35, store.get)] != [r.args for r in out[:35]]


def test_a_window_reads_only_the_pages_it_touches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_pages, "PAGE_ROWS", 100)
    store = Store()
    data = manifest_bytes(put_pages(rows(1000), store.put, epochs=2, seed=1))
    whole = read(data, 0, 2000, store.get)
    store.reads.clear()
    window = read(data, 1250, 1500, store.get)  # 250 positions of epoch 1
    assert window == whole[1250:1500]
    assert len(store.reads) <= 4  # a block shuffle: pages in order, rows shuffled within each


def test_without_a_seed_the_taskset_order_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_pages, "PAGE_BYTES", 200)  # pages by size, too
    store = Store()
    manifest = put_pages(rows(20), store.put)
    assert len(manifest.pages) > 1 and sum(manifest.counts) == 20
    assert [r.args["i"] for r in read(manifest_bytes(manifest), 3, 17, store.get)] == list(range(3, 17))


@pytest.mark.parametrize("epochs", [-1, 0, True, 1.5, "2", None])
def test_bad_epochs_are_one_clear_error(epochs: object) -> None:
    with pytest.raises(ConfigError, match="epochs"):
        check_epochs(epochs, None)


def test_a_bad_seed_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="seed"):
        check_epochs(2, "x")


def test_a_chain_reads_each_parts_positions_in_order_with_the_adds_suffix() -> None:
    store = Store()
    base = store.put(manifest_bytes(put_pages(rows(3), store.put, epochs=2, seed=1)))
    added = store.put(manifest_bytes(put_pages(rows(2), store.put)))
    chain = row_pages.extend(store.get(base), base, 6, added, 2)
    again = row_pages.extend(chain.model_dump_json().encode(), "chain", 8, added, 2)
    assert [p.suffix for p in again.parts] == ["", "a1", "a2"] and again.total == 10
    data = again.model_dump_json().encode()
    assert is_manifest(data)
    got = row_pages.read_any(data, 0, 10, store.get)
    assert got[:6] == read(store.get(base), 0, 6, store.get)  # the job's own positions keep their rows
    first, second = (r.slug for r in rows(2))
    assert [r.slug for r in got[6:]] == [f"{first}-a1", f"{second}-a1", f"{first}-a2", f"{second}-a2"]
    assert [r.args["i"] for r in got[6:]] == [0, 1, 0, 1]
    assert [r.slug for r in row_pages.read_any(data, 5, 8, store.get)] == [got[5].slug, *[r.slug for r in got[6:8]]]
