"""The stream's pages as plain logic and real storage: which groups leave the state, how a reader
behind the oldest kept group finds them, the cursor rule after close, and bad page sizes.

No Temporal here (the end-to-end runs are tests/training/test_stream_pages.py): ``StreamState``
is the pure model the workflow carries, and ``StreamStore`` writes real files in this session's
``ROLLOUTS_STORAGE``.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import RolloutResult
from durable_rollouts.settings import settings
from durable_rollouts.temporal.live import stream_options
from durable_rollouts.temporal.stream_pages import StreamStore
from durable_rollouts.workflows.stream import (
    AckRequest,
    StreamOptions,
    StreamRequest,
    StreamState,
    check_batch,
)
from durable_rollouts.workflows.stream_paging import StreamManifest, page_span


def _finish(state: StreamState, n: int) -> None:
    """Start and finish ``n`` more groups of one member each."""
    for _ in range(n):
        gid = f"g{state.started_groups}"
        state.group_started(gid, expected=1)
        state.finish(RolloutResult(rollout_id=f"{gid}-0", slug="t", group_id=gid, group_index=0,
                                   row_index=state.started_groups, status="succeeded"), None)


def _page_all(state: StreamState, final: bool = False) -> list[list[str]]:
    pages = []
    while (groups := state.next_page(final)) is not None:
        pages.append([g.group_id for g in groups])
        state.paged(len(groups))
    return pages


def test_only_full_pages_every_registered_consumer_acknowledged_leave_the_state() -> None:
    state = StreamState(options=StreamOptions(page_size=3), cursors={"a": 0, "b": 0})
    _finish(state, 7)
    assert _page_all(state) == []  # nothing acknowledged
    state.ack(AckRequest(consumer="a", start=0, end=7))
    state.ack(AckRequest(consumer="b", start=0, end=2))
    assert _page_all(state) == []  # b is behind the first full page
    state.ack(AckRequest(consumer="b", start=2, end=6))
    assert _page_all(state) == [["g0", "g1", "g2"], ["g3", "g4", "g5"]]
    assert (state.base, state.pages, len(state.delivered), state.total()) == (6, 2, 1, 7)
    _finish(state, 1)
    assert [g.seq for g in state.delivered] == [6, 7]  # sequence numbers go on past the pages
    # a reader behind base gets no kept groups from the query, but is told where the pages end
    view = state.view(StreamRequest(consumer="late", start=0, limit=5), False, None)
    assert (view.groups, view.base, view.page_size, view.delivered) == ([], 6, 3, 8)
    view = state.view(StreamRequest(consumer="b", start=0, limit=5), False, None)
    assert view.start == 6 and [g.seq for g in view.groups] == [6, 7]
    state.register("late")  # a late consumer holds every further group in the state
    state.ack(AckRequest(consumer="b", start=6, end=8))
    state.ack(AckRequest(consumer="a", start=7, end=8))
    assert _page_all(state) == []
    assert _page_all(state, final=True) == [["g6", "g7"]]  # closing: a short last page
    assert state.delivered == [] and state.base == 8


def test_a_stream_without_a_page_size_never_pages() -> None:
    state = StreamState(cursors={"a": 0})
    _finish(state, 5)
    state.ack(AckRequest(consumer="a", start=0, end=5))
    assert _page_all(state) == [] and _page_all(state, final=True) == []
    assert len(state.delivered) == 5


def test_a_closing_stream_refuses_acks_and_registrations_with_the_sealed_reason() -> None:
    state = StreamState(options=StreamOptions(page_size=2), cursors={"a": 0})
    _finish(state, 2)
    state.sealed = True
    with pytest.raises(ValueError, match="closing"):
        state.check_ack(AckRequest(consumer="a", start=0, end=1))
    with pytest.raises(ValueError, match="closing"):
        state.check_open()


def test_the_cursor_rule_is_the_same_after_close() -> None:
    req = AckRequest(consumer="c", start=2, end=4)
    check_batch(req, 2, 10)  # the next groups
    check_batch(AckRequest(consumer="c", start=0, end=2), 3, 10)  # a repeat: a no-op
    with pytest.raises(ValueError, match="unknown batch 2-4 .* next unacknowledged group is 1 of 10"):
        check_batch(req, 1, 10)
    with pytest.raises(ValueError, match="unknown batch 2-4"):
        check_batch(req, 2, 3)  # past the end
    assert page_span(3, 4, 14) == (12, 14) and page_span(0, 4, 14) == (0, 4)


def test_pages_manifest_and_cursors_round_trip_through_storage() -> None:
    store = StreamStore(f"unit-{uuid.uuid4().hex[:8]}")
    state = StreamState(options=StreamOptions(page_size=4), cursors={"a": 0})
    _finish(state, 10)

    async def go() -> None:
        for n in range(3):  # pages 0-2: [0, 4), [4, 8), [8, 10)
            await store.put_page(n, state.delivered[n * 4:(n + 1) * 4])
        await store.put_page(1, state.delivered[4:8])  # written again: the same page
        got = await store.read(3, 6, 4, 10)
        assert [g.seq for g in got] == [3, 4, 5, 6, 7, 8]
        assert [g.seq for g in await store.read(8, 5, 4, 10)] == [8, 9]
        assert await store.manifest() is None
        await store.put_manifest(StreamManifest(job_id=store.job_id, page_size=4, delivered=10,
                                                cursors={"a": 3}))
        manifest = await store.manifest()
        assert manifest is not None and manifest.pages == 3 and manifest.cursors == {"a": 3}
        assert await store.cursor("a") == 0
        assert await store.put_cursor("a", 6) == 6
        assert await store.put_cursor("a", 4) == 6  # never backwards
        assert await StreamStore(store.job_id).cursor("a") == 6

    asyncio.run(go())


def test_a_page_size_of_zero_or_less_is_a_clear_error(monkeypatch) -> None:
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ConfigError, match=r"page_size=.*: use a whole number of groups >= 1"):
            stream_options(None, None, "resample", 60.0, page_size=bad)  # type: ignore[arg-type]
    assert stream_options(None, None, "resample", 60.0).page_size == settings().stream_page_size
    monkeypatch.setenv("ROLLOUTS_STREAM_PAGE_SIZE", "0")
    with pytest.raises(ConfigError, match="ROLLOUTS_STREAM_PAGE_SIZE='0'"):
        stream_options(None, None, "resample", 60.0)


def test_an_unregistered_consumer_holds_nothing_and_registering_again_restores_its_cursor() -> None:
    state = StreamState(options=StreamOptions(page_size=2), cursors={"trainer": 0, "eval": 0})
    _finish(state, 6)
    state.ack(AckRequest(consumer="trainer", start=0, end=6))
    state.ack(AckRequest(consumer="eval", start=0, end=1))
    assert _page_all(state) == []  # eval holds every group from 1 on
    with pytest.raises(ValueError, match="not registered"):
        state.check_unregister("nobody")
    assert state.unregister("eval") == 1
    with pytest.raises(ValueError, match="not registered"):
        state.check_unregister("eval")
    assert _page_all(state) == [["g0", "g1"], ["g2", "g3"], ["g4", "g5"]]
    assert state.caught_up() and state.all_cursors() == {"trainer": 6, "eval": 1}
    assert state.register("eval") == 1  # back: it resumes where it stopped, not from 0
    assert state.retired == {} and not state.caught_up()
    view = state.view(StreamRequest(consumer="eval", start=0, limit=4), False, None)
    assert (view.cursor, view.start, view.groups, view.base) == (1, 1, [], 6)  # read from pages
    state.sealed = True
    with pytest.raises(ValueError, match="closing"):
        state.check_unregister("eval")
