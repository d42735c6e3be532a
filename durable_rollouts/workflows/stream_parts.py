"""A streamed batch wider than one workflow may hold: parts that feed the batch's one stream.

A mixin of ``TasksetRun``, both sides of it. The batch (the workflow its consumers read) starts
``n`` parts over group-aligned slices of its slots (``fan_out.part_slices``), as ``fan_out`` does
for a batch without a stream, with three differences:

- A part forwards every rollout it finishes to the batch (signal ``part_results``, one per wake
  of the part with all it finished), so the batch's ``StreamState`` judges and delivers each
  group as its last member ends, in the order the batch received them: one stream, one cursor
  per consumer, whichever part ran the group.
- ``max_in_flight`` holds across the parts by grants: a part starts a new group only while it
  has a grant left (``TasksetRunInput.credits``, raised by signal ``grant_groups``); the batch
  grants a group whenever fewer than ``max_in_flight`` groups are granted and not finished, or
  delivered and not acknowledged. The policy a trainer publishes reaches the parts by signal
  ``part_policy``.
- Parts are started with ``ABANDON`` and report their end by signal (``part_done``), so the batch
  continues as new while they run (a training run's stream takes more acks and signals than one
  run may hold) and the next run goes on waiting for them (``TasksetRunInput.parts``).

Groups a stale policy sends back for re-sampling, and rows added while the parts run, run in the
batch itself once its parts are done. Deterministic: stdlib, temporalio and the workflow models.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import shard_id
    from durable_rollouts.models import RolloutResult
    from durable_rollouts.workflows.fan_out import add_progress
    from durable_rollouts.workflows.stream import PolicyRef, StreamState
    from durable_rollouts.workflows.types import (
        PartDone,
        PartResults,
        PartRun,
        Progress,
        ResultsRef,
        TasksetRunInput,
        TasksetRunResult,
    )

__all__ = ["FORWARD_CHUNK", "MAX_SIGNALS_PER_RUN", "StreamParts"]

FORWARD_CHUNK = 100  # results per ``part_results`` signal (well under the 2 MB payload limit)
# A run continues as new before it takes this many of these signals (Temporal caps signals per
# execution at 10,000 by default).
MAX_SIGNALS_PER_RUN = 2_000
CANCEL_WAIT = timedelta(minutes=10)  # a cancelled batch waits this long for its parts to close
KEY_JOB_ID = SearchAttributeKey.for_keyword("RolloutsJobId")


class StreamParts:
    """Both sides of a streamed batch run as parts (the workflow sets the fields)."""

    _inp: TasksetRunInput
    _stream: StreamState | None
    _policy: PolicyRef | None
    _progress: Progress | None
    _failed_on: str | None
    _signals_in = 0  # part signals this run took (``MAX_SIGNALS_PER_RUN``)
    _part_news = 0  # part_results / part_done signals taken (wakes the batch)
    _parts: dict[int, PartRun]
    _outbox: list[RolloutResult]  # a part's finished rollouts not yet forwarded
    _sends: list[asyncio.Future[Any]]  # signals sent and not yet confirmed
    _page_out: Callable[..., Awaitable[bool]]  # the stream's (``stream_handlers``)
    _part_input: Callable[..., TasksetRunInput]  # a part's input (``fan_out``)
    _too_long: Callable[[TasksetRunInput], bool]  # the workflow's

    def _init_parts(self, inp: TasksetRunInput) -> None:
        self._parts = {p.part: p for p in inp.parts}
        self._outbox, self._sends = [], []

    # -- the part's side ---------------------------------------------------------------------

    @workflow.signal(name="grant_groups")
    def grant_groups(self, granted: int) -> None:
        """The batch lets this part start ``granted`` groups in all (grants only grow)."""
        self._signals_in += 1
        if self._inp.credits is not None:
            self._inp.credits = max(self._inp.credits, granted)

    @workflow.signal(name="part_policy")
    def part_policy(self, policy: PolicyRef) -> None:
        """The policy the batch's trainer published: new rollouts sample with it."""
        self._signals_in += 1
        if self._policy is None or policy.version >= self._policy.version:
            self._policy = policy

    def _may_open_group(self) -> bool:
        """Whether a new group may start: the stream's pacing, or a part's grants."""
        if self._stream is not None:
            return self._stream.may_start_group()
        inp = self._inp
        if inp.credits is None:
            return True
        assert self._progress is not None
        return self._progress.started // inp.group < inp.credits

    def _forward(self, inp: TasksetRunInput) -> None:
        """Send what this part finished to its batch (the sends are confirmed later)."""
        if inp.forward_to is None:
            return
        while self._outbox:
            chunk, self._outbox = self._outbox[:FORWARD_CHUNK], self._outbox[FORWARD_CHUNK:]
            self._send(inp.forward_to, "part_results", PartResults(part=inp.part or 0, results=chunk))

    async def _forwarded(self, inp: TasksetRunInput) -> None:
        """Forward the rest and wait until the batch has every result (before the part continues
        as new or closes: its ``part_done`` never overtakes its results)."""
        self._forward(inp)
        for failure in await self._settle_sends():  # the batch closed (terminated): no one to tell
            workflow.logger.warning("part %s: results not forwarded (%s)", inp.part, failure)

    async def _report_done(self, inp: TasksetRunInput, result: TasksetRunResult) -> None:
        """Tell the batch this part closed, with its counters and results (claim checks)."""
        if inp.forward_to is None:
            return
        await self._forwarded(inp)
        with contextlib.suppress(Exception):  # the batch closed (terminated): no one to tell
            await workflow.get_external_workflow_handle(inp.forward_to).signal(
                "part_done", PartDone(part=inp.part or 0, result=result))

    # -- the batch's side --------------------------------------------------------------------

    @workflow.signal(name="part_results")
    def part_results(self, batch: PartResults) -> None:
        """Rollouts a part finished: each goes to its group, which may finish (and be delivered)."""
        self._signals_in += 1
        self._part_news += 1
        stream, progress = self._stream, self._progress
        if stream is None:
            return
        part = self._parts.get(batch.part)
        for result in batch.results:
            stream.group_started(result.group_id, self._inp.group)
            before = len(stream.slots)
            if stream.finish(result, self._policy) and part is not None:
                part.finished += 1
            if progress is not None:  # a re-sampled group's rollouts run here, later
                progress.total += len(stream.slots) - before

    @workflow.signal(name="part_done")
    def part_done(self, done: PartDone) -> None:
        self._signals_in += 1
        self._part_news += 1
        part = self._parts.get(done.part)
        if part is not None:
            part.done = done.result

    async def _start_stream_parts(self, inp: TasksetRunInput, slices: list[tuple[int, int]]) -> None:
        """Start a part per slice, each with its share of ``max_in_flight`` as grants."""
        assert self._stream is not None and self._progress is not None
        me, n = workflow.info().workflow_id, len(slices)
        limit = self._stream.options.max_in_flight
        attrs = TypedSearchAttributes([SearchAttributePair(KEY_JOB_ID, inp.job_id)]) \
            if inp.search_attributes else None
        for k, (start, stop) in enumerate(slices):
            share = None if limit is None else limit // n + (k < limit % n)
            wid = shard_id(me, k)
            child = self._part_input(inp, k, start, stop, n, {}).model_copy(update={
                "stream": None, "stream_state": None, "forward_to": me, "credits": share,
                "policy": self._policy, "parts": []})
            await workflow.start_child_workflow(
                "TasksetRun", child, id=wid, task_queue=inp.task_queue, result_type=TasksetRunResult,
                parent_close_policy=ParentClosePolicy.ABANDON, search_attributes=attrs,
                static_summary=f"{inp.job_name}: part {k + 1} of {n} ({stop - start} rollouts)")
            self._parts[k] = PartRun(part=k, workflow_id=wid, groups=(stop - start) // inp.group,
                                     granted=share,
                                     policy_version=None if self._policy is None else self._policy.version)
            self._progress.parts.append(wid)

    async def _run_stream_parts(self, inp: TasksetRunInput, slices: list[tuple[int, int]],
                                results: list[RolloutResult], refs: list[ResultsRef]) -> bool:
        """Run the parts (start them, or go on with those a previous run carried) until every
        one reported its end, granting groups and passing the policy on meanwhile; True when the
        run should continue as new first (its parts go on)."""
        if slices:
            await self._start_stream_parts(inp, slices)
        try:
            while True:
                seen = self._part_news  # before any await: a signal taken meanwhile wakes the wait
                self._merge_parts(results, refs)
                if not self._parts:
                    return False
                self._grant()
                self._pass_policy()
                await self._page_out(inp)
                if self._too_long(inp):
                    return True
                await workflow.wait_condition(
                    lambda: self._part_news != seen or self._part_ended() or self._grantable()
                    or self._policy_news() or self._too_long(inp))
        except asyncio.CancelledError:
            for part in self._parts.values():
                if part.done is None:
                    with contextlib.suppress(Exception):  # closed meanwhile: nothing to cancel
                        await workflow.get_external_workflow_handle(part.workflow_id).cancel()
            with contextlib.suppress(asyncio.TimeoutError):  # each part's rollouts tear down first
                await workflow.wait_condition(
                    lambda: all(p.done is not None for p in self._parts.values()), timeout=CANCEL_WAIT)
            raise
        finally:
            await self._settle_sends()

    def _merge_parts(self, results: list[RolloutResult], refs: list[ResultsRef]) -> None:
        """Add every part that reported its end to the batch (counters, results); under
        ``on_error="fail"`` the first failed part stops the others."""
        progress = self._progress
        assert progress is not None
        for k in sorted(k for k, p in self._parts.items() if p.done is not None):
            part = self._parts.pop(k)
            done = part.done
            assert done is not None
            if part.workflow_id in progress.parts:
                progress.parts.remove(part.workflow_id)
            add_progress(progress, done.progress)
            results.extend(done.results)
            refs.extend(done.result_refs)
            if done.failed_on is not None and self._failed_on is None:
                self._failed_on = done.failed_on
                for other in self._parts.values():
                    self._send(other.workflow_id, "stop_batch", done.failed_on)

    def _part_ended(self) -> bool:
        return any(p.done is not None for p in self._parts.values())

    def _room(self) -> int:
        """Groups that may still be granted under ``max_in_flight`` (granted and not finished,
        or delivered and not acknowledged by the furthest consumer, count against it)."""
        stream = self._stream
        assert stream is not None and stream.options.max_in_flight is not None
        granted = sum((p.granted or 0) - p.finished for p in self._parts.values() if p.done is None)
        furthest = max(stream.cursors.values(), default=0)
        return stream.options.max_in_flight - granted - (stream.total() - furthest)

    def _wanting(self) -> list[PartRun]:
        return [p for p in self._parts.values()
                if p.done is None and p.granted is not None and p.granted < p.groups]

    def _grantable(self) -> bool:
        return (self._stream is not None and self._stream.options.max_in_flight is not None
                and self._failed_on is None and bool(self._wanting()) and self._room() > 0)

    def _grant(self) -> None:
        """Grant groups while there is room, each to the part with the fewest open grants."""
        raised: set[int] = set()
        room = self._room() if self._grantable() else 0
        while room > 0 and (wanting := self._wanting()):
            part = min(wanting, key=lambda p: ((p.granted or 0) - p.finished, p.part))
            part.granted = (part.granted or 0) + 1
            raised.add(part.part)
            room -= 1
        for k in sorted(raised):
            self._send(self._parts[k].workflow_id, "grant_groups", self._parts[k].granted)

    def _policy_news(self) -> bool:
        version = None if self._policy is None else self._policy.version
        return any(p.done is None and p.policy_version != version for p in self._parts.values())

    def _pass_policy(self) -> None:
        if self._policy is None:
            return
        for part in self._parts.values():
            if part.done is None and part.policy_version != self._policy.version:
                part.policy_version = self._policy.version
                self._send(part.workflow_id, "part_policy", self._policy)

    def _send(self, workflow_id: str, signal: str, arg: Any) -> None:
        """Signal ``workflow_id`` (confirmed later: ``_settle_sends``); drops the sends confirmed
        so far."""
        for sent in [s for s in self._sends if s.done()]:
            self._sends.remove(sent)
            if not sent.cancelled():
                sent.exception()  # retrieved: a refused one went to a workflow that closed meanwhile
        self._sends.append(asyncio.ensure_future(
            workflow.get_external_workflow_handle(workflow_id).signal(signal, arg)))

    async def _settle_sends(self) -> list[BaseException]:
        """Wait for the signals this run sent; returns the refused ones' errors (a workflow that
        closed meanwhile refuses its signals)."""
        sends, self._sends = self._sends, []
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        return [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
