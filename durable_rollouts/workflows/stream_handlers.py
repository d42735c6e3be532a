"""The ``TasksetRun`` workflow's stream: pacing against consumers, and its queries and updates.

A mixin of ``TasksetRun``. Pacing: which rollout starts next (a re-sampled group's first), whether
a new group may start (``max_in_flight``), and lingering once every rollout is done.

Consumers read finished groups with the ``stream_view`` query (no history written), register
and acknowledge with updates (``stream_register``, ``stream_ack``), and the trainer publishes its
policy with ``set_policy``; ``stream_close`` lets a lingering batch finish. A consumer that has
read everything waits for more with ``stream_wait``, an update that returns once the groups it
wants are delivered (a long poll: no query every half second, no poll interval in the delivery
lag). Those handlers add no command, so histories of batches without a stream replay unchanged.
``stream_add`` (further rows for the running job, ``LiveJob.add``) runs one activity: it chains
the added rows after the batch's own in storage. Validators reject bad input before anything is
recorded (a bad ack never harms the job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import group_id
    from durable_rollouts.workflows.stream import (
        AckRequest,
        PolicyRef,
        StreamRequest,
        StreamState,
        StreamView,
        WaitRequest,
        check_consumer,
    )
    from durable_rollouts.workflows.stream_paging import (
        ACT_STREAM_MANIFEST,
        ACT_STREAM_PAGE,
        PATCH_PAGES,
        PATCH_WAIT_HANDOVER,
        KeptState,
        StreamManifest,
        StreamManifestInput,
        StreamPageInput,
    )
    from durable_rollouts.workflows.types import (
        ACT_EXTEND_ROWS,
        AddedRows,
        AddRows,
        ExtendRowsInput,
        Progress,
        TasksetRunInput,
    )

__all__ = ["ADDS_REMEMBERED", "StreamHandlers"]

ADDS_REMEMBERED = 100  # the latest adds' ids a run keeps (a resent add is taken once)


class StreamHandlers:
    """Stream state of one batch run and its handlers (the workflow sets the fields)."""

    _stream: StreamState | None = None
    _policy: PolicyRef | None = None
    _rollouts_done = False
    _stream_updates = 0  # updates this run accepted (a run takes at most 2,000)
    _touched = False  # a consumer acted since the batch started lingering
    _paging = False  # acknowledged groups leave the state in pages (``stream_paging``)
    _inp: TasksetRunInput  # the run's input (the workflow's); ``stream_add`` grows its rows
    _progress: Progress | None = None
    _adds = 0  # adds taken and not yet done (the run must not close under them)
    _adding = False  # an add is chaining its rows (one at a time)
    _grew = False  # rows were added in this run (it continues as new, so its input names them)
    _additions = 0  # adds taken in this run (wakes a run waiting on its rollouts)
    _may_open_group: Callable[[], bool]  # whether a new group may start (``stream_parts``)
    _leaving = False  # the run is about to continue as new or close: waiting consumers return
    _handing_over = False  # the run is about to continue as new: nothing more to read in it
    _waits: dict[str, int]  # each consumer's latest stream_wait (an older one returns)

    # -- slots: what to start next (the batch's own, or a re-sampled group's) -------------------

    def _more(self, index: int, total: int) -> bool:
        return index < total or (self._stream is not None and bool(self._stream.slots))

    def _next_slot(self, inp: TasksetRunInput, index: int, total: int) -> tuple[int, int, int] | None:
        """(row, group index, resample) of the next rollout to start, or None: a re-sampled
        group's rollouts first, then the batch's own in order."""
        if self._stream is not None and self._stream.slots:
            return self._stream.slots[0]
        if index < total:
            return (*self._slot(inp, index), 0)
        return None

    def _consume(self, slot: tuple[int, int, int], index: int) -> int:
        """Mark ``slot`` started; returns the next batch index."""
        if slot[2]:  # a re-sampled group's rollout
            assert self._stream is not None
            self._stream.slots.pop(0)
            return index
        return index + 1

    def _group_started(self, inp: TasksetRunInput, slot: tuple[int, int, int]) -> None:
        if self._stream is None:
            return
        row_index, _, resample = slot
        expected = inp.group if inp.only is None else sum(1 for r, _ in inp.only if r == row_index)
        self._stream.group_started(group_id(inp.job_id, row_index, inp.batch_index, resample), expected,
                                   resample)

    def _may_start(self, inp: TasksetRunInput, slot: tuple[int, int, int]) -> bool:
        """Back-pressure: a new group starts only while fewer than ``max_in_flight`` groups run or
        wait unacknowledged; a started group's rollouts always start."""
        if self._stream is None:  # a part of a streamed batch starts a new group on a grant
            return slot[1] > 0 or self._may_open_group()
        gid = group_id(inp.job_id, slot[0], inp.batch_index, slot[2])
        if gid not in self._stream.pending and not self._stream.may_start_group():
            return False
        self._group_started(inp, slot)
        return True

    def _held_back(self, index: int, total: int) -> bool:
        """More is to start, and the consumers hold the next group back (an ack frees it)."""
        return self._more(index, total) and not self._may_open_group()

    def _held(self, index: int, total: int, inp: TasksetRunInput) -> bool:
        """Nothing runs, more is to start, and the consumers hold it back (until an ack, or until
        the history is long enough to continue as new)."""
        return self._held_back(index, total) and not self._too_long(inp) and self._failed_on is None

    # -- pages: acknowledged groups out of the state, the rest when the batch closes -----------

    def _start_paging(self) -> None:
        """Page this run's stream if its options ask for it (a patch: runs recorded before it
        never page, and replay as they ran)."""
        stream = self._stream
        self._paging = (stream is not None and stream.options.page_size is not None
                        and workflow.patched(PATCH_PAGES))

    async def _page_out(self, inp: TasksetRunInput, final: bool = False) -> bool:
        """Write every full page every registered consumer acknowledged (``final``: every kept
        group) to storage, then drop those groups from the state. False when the store failed
        (the groups stay in the state: the next call tries again; the batch goes on)."""
        stream = self._stream
        if not self._paging or stream is None:
            return False
        while (groups := stream.next_page(final)) is not None:
            try:
                await workflow.execute_activity(
                    ACT_STREAM_PAGE, StreamPageInput(job_id=inp.job_id, batch_index=inp.batch_index,
                                                     page=stream.pages, groups=groups),
                    result_type=int, start_to_close_timeout=timedelta(minutes=2),
                    retry_policy=RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30)))
            except ActivityError as err:
                workflow.logger.warning("batch %s: stream page %d not stored (%s); kept in state",
                                        inp.job_id, stream.pages, err.cause or err)
                return False
            stream.paged(len(groups))
        return True

    async def _seal(self, inp: TasksetRunInput) -> None:
        """The batch is closing: refuse further acks (they go to storage), write the kept groups
        as the last pages and the manifest with every consumer's cursor."""
        self._leaving = True  # waiting consumers return (and read what is left)
        stream = self._stream
        if not self._paging or stream is None or stream.options.page_size is None:
            return
        stream.sealed = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not await self._page_out(inp, final=True):
            return  # no manifest: readers of the closed job query it (its state kept the rest)
        manifest = StreamManifest(job_id=inp.job_id, batch_index=inp.batch_index,
                                  page_size=stream.options.page_size, delivered=stream.total(),
                                  cursors=stream.all_cursors(), counts=dict(stream.counts),
                                  policy=self._policy)
        try:
            await workflow.execute_activity(
                ACT_STREAM_MANIFEST, StreamManifestInput(manifest=manifest),
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30)))
        except ActivityError as err:
            workflow.logger.warning("batch %s: stream manifest not stored (%s)", inp.job_id,
                                    err.cause or err)

    @workflow.query(name="stream_kept")
    def stream_kept(self) -> KeptState:
        """How much of the stream this run holds (tests and benchmarks bound it)."""
        stream = self._need_stream()
        return KeptState(kept_groups=len(stream.delivered), base=stream.base, pages=stream.pages,
                         page_size=stream.options.page_size,
                         state_bytes=len(stream.model_dump_json()))

    async def _linger(self, inp: TasksetRunInput) -> bool:
        """Stay open for the consumers once every rollout is done: until they all caught up, the
        stream is closed, or ``linger_s`` passed without a consumer acting. True when the run
        should continue as new first (a long history)."""
        assert self._stream is not None
        stream = self._stream
        while not (stream.closed or stream.caught_up()) or self._adds:
            await self._page_out(inp)
            if self._too_long(inp) or self._grew:
                return True
            self._touched = False
            try:
                await workflow.wait_condition(
                    lambda: (stream.closed or stream.caught_up() or self._touched or self._too_long(inp)
                             or self._adds or self._grew),
                    timeout=timedelta(seconds=stream.options.linger_s))
            except asyncio.TimeoutError:
                workflow.logger.warning("batch %s: consumers did not catch up within %.0f s; closing",
                                        workflow.info().workflow_id, stream.options.linger_s)
                return False
            if self._adds:  # rows are being added: the run goes on with them
                await workflow.wait_condition(lambda: not self._adds)
        return self._grew

    def _too_long(self, inp: TasksetRunInput) -> bool:  # the workflow's
        raise NotImplementedError

    def _slot(self, inp: TasksetRunInput, index: int) -> tuple[int, int]:  # the workflow's
        raise NotImplementedError

    _failed_on: str | None = None

    def _need_stream(self) -> StreamState:
        if self._stream is None:
            raise ValueError("this batch does not stream finished groups: start it with "
                             "Taskset.start(...) to consume it with job.stream()")
        return self._stream

    @workflow.query(name="stream_view")
    def stream_view(self, req: StreamRequest) -> StreamView:
        """Groups ``req.consumer`` has not acknowledged, from ``req.start`` (at most ``req.limit``)."""
        stream = self._need_stream()
        return stream.view(req, self._stream_done(), self._policy)

    def _stream_done(self) -> bool:
        """No more groups will be delivered."""
        stream = self._need_stream()
        return self._rollouts_done and not stream.pending and not stream.slots

    @workflow.update(name="stream_wait")
    async def stream_wait(self, req: WaitRequest) -> int:
        """Return once ``req.want`` groups from ``req.start`` on are delivered, the stream is done,
        the run is leaving (continue-as-new, close), or the consumer waits again (its newer wait
        replaces this one: a consumer holds one wait at most). Returns the groups delivered, or,
        woken short because the run continues as new, ``-1 - delivered``: the consumer waits on
        the next run rather than query this one as it closes (a query that reaches a run during
        its last workflow task is answered by replaying the closed run). Runs recorded before
        ``PATCH_WAIT_HANDOVER`` return the count."""
        stream = self._need_stream()
        self._stream_updates += 1
        self._touched = True
        waits = self._waits
        token = waits[req.consumer] = waits.get(req.consumer, 0) + 1
        await workflow.wait_condition(
            lambda: (stream.total() >= req.start + req.want or self._stream_done() or self._leaving
                     or stream.sealed or waits.get(req.consumer) != token))
        total = stream.total()
        if (self._handing_over and total < req.start + req.want and waits.get(req.consumer) == token
                and workflow.patched(PATCH_WAIT_HANDOVER)):
            return -1 - total
        return total

    @stream_wait.validator
    def _check_wait(self, req: WaitRequest) -> None:
        self._need_stream().check_open()
        check_consumer(req.consumer)

    @workflow.update(name="stream_register")
    def stream_register(self, consumer: str) -> int:
        """Register a consumer (idempotent); returns its cursor."""
        self._stream_updates += 1
        self._touched = True
        return self._need_stream().register(consumer)

    @stream_register.validator
    def _check_register(self, consumer: str) -> None:
        self._need_stream().check_open()
        check_consumer(consumer)

    @workflow.update(name="stream_unregister")
    def stream_unregister(self, consumer: str) -> int:
        """Stop holding groups for ``consumer`` (one that will not come back soon); returns its
        cursor. Registering again resumes from it."""
        self._stream_updates += 1
        self._touched = True
        return self._need_stream().unregister(consumer)

    @stream_unregister.validator
    def _check_unregister(self, consumer: str) -> None:
        self._need_stream().check_unregister(consumer)

    @workflow.update(name="stream_ack")
    def stream_ack(self, req: AckRequest) -> int:
        """Acknowledge groups ``[req.start, req.end)``; returns the consumer's new cursor."""
        self._stream_updates += 1
        self._touched = True
        return self._need_stream().ack(req)

    @stream_ack.validator
    def _check_ack(self, req: AckRequest) -> None:
        self._need_stream().check_ack(req)

    @workflow.update(name="set_policy")
    def set_policy(self, policy: PolicyRef) -> int:
        """The policy new rollouts sample with; returns its version."""
        self._stream_updates += 1
        self._policy = policy
        return policy.version

    @set_policy.validator
    def _check_policy(self, policy: PolicyRef) -> None:
        if self._policy is not None and policy.version < self._policy.version:
            raise ValueError(f"policy version {policy.version} is behind the job's current "
                             f"version {self._policy.version}: versions only go forward")

    @workflow.update(name="stream_add")
    async def stream_add(self, req: AddRows) -> AddedRows:
        """Further rows for this job (``LiveJob.add``): chained after its own rows in storage,
        started in order after them, streamed like them. The same request id is taken once."""
        self._stream_updates += 1
        self._adds += 1  # before any await: a lingering run sees it and stays
        try:
            await workflow.wait_condition(lambda: not self._adding)  # one add at a time
            self._adding = True
            try:
                return await self._add(req)
            finally:
                self._adding = False
        finally:
            self._adds -= 1

    async def _add(self, req: AddRows) -> AddedRows:
        inp = self._inp
        for record in inp.added:  # "<id>:<first>:<positions>" of recent adds
            rid, first, positions = record.rsplit(":", 2)
            if rid == req.id:  # the caller sent it again (a lost reply): nothing more to add
                return AddedRows(first=int(first), positions=int(positions),
                                 rollouts=int(positions) * inp.group, rows_ref=inp.rows_ref or "",
                                 total_rows=self._row_count(inp))
        first = self._row_count(inp)
        chain = await workflow.execute_activity(
            ACT_EXTEND_ROWS, ExtendRowsInput(base_ref=inp.rows_ref, base_rows=inp.rows, base_total=first,
                                             added_ref=req.rows_ref, added_total=req.positions),
            result_type=str, start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30)))
        inp.rows_ref, inp.rows, inp.total_rows = chain, [], first + req.positions
        inp.added = [*inp.added, f"{req.id}:{first}:{req.positions}"][-ADDS_REMEMBERED:]
        if self._progress is not None:
            self._progress.total += req.positions * inp.group
        self._rollouts_done = False
        self._grew = True
        self._additions += 1
        self._touched = True
        return AddedRows(first=first, positions=req.positions, rollouts=req.positions * inp.group,
                         rows_ref=chain, total_rows=first + req.positions)

    @stream_add.validator
    def _check_add(self, req: AddRows) -> None:
        stream = self._need_stream()
        stream.check_open()
        inp = self._inp
        job = workflow.info().workflow_id
        if stream.closed or self._failed_on is not None:
            raise ValueError(f"job {job} was closed{' by on_error=fail' if self._failed_on else ''}: "
                             "it takes no further rows; start a new job")
        if inp.open_ended:
            raise ValueError(f"job {job} runs its rows until it is closed (epochs=None): "
                             "it takes no further rows")
        if req.group is not None and req.group != inp.group:
            raise ValueError(f"group={req.group}: job {job} runs every row {inp.group} times; "
                             "rows added to it do too")
        for what, mine, theirs in (("agent", inp.agent, req.agent), ("runtime", inp.provider, req.provider)):
            if theirs is not None and theirs != mine:
                raise ValueError(f"the {what} differs from job {job}'s: rows added to a job run with "
                                 f"its own {what}")
        if req.taskset_class != inp.taskset_class:
            raise ValueError(f"job {job} resolves its rows with {inp.taskset_class or 'a plain Taskset'}; "
                             f"rows of {req.taskset_class or 'a plain Taskset'} cannot join it")

    def _row_count(self, inp: TasksetRunInput) -> int:  # the workflow's
        raise NotImplementedError

    @workflow.update(name="stream_close")
    def stream_close(self) -> bool:
        """Let the batch finish once its rollouts are done, whoever has not caught up."""
        self._stream_updates += 1
        self._need_stream().closed = True
        return True

    @stream_close.validator
    def _check_close(self) -> None:
        self._need_stream()
