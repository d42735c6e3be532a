"""The ``TasksetRun`` workflow: one batch of a job, rows x group ``Rollout`` children.

Deterministic: imports only stdlib, temporalio, pydantic and the pure data models; activities
are referenced by name. Expands rows x group task-major, resolves each group once (stored in
workflow state, so replays and continue-as-new reuse it), keeps at most ``max_concurrent``
children pending, counts compact results, answers the ``progress`` query, shows live details in
the Web UI, and continues-as-new before its history grows large: the rollouts still running go on
(their children outlive the run) and the next run awaits them (``rollout_children``); a streamed
batch, and runs recorded before ``PATCH_OUTLIVE``, drain their children first.
A batch wider than one workflow may hold runs as parts, child TasksetRuns (``fan_out``; a
streamed one, ``stream_parts``); each rollout is a ``Rollout`` child (``rollout_children``); what
ends rollouts early (an unresolved group, ``on_error="fail"``, a cancel) is ``batch_stops``.

A streamed batch (``Taskset.start``: ``TasksetRunInput.stream``) also keeps its finished groups
for consumers (``stream``, handlers in ``stream_handlers``): it starts a new group only while
fewer than ``max_in_flight`` groups run or wait unacknowledged, re-samples a stale group, and
stays open after its last rollout until its consumers caught up (or ``linger_s`` passed).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import child_id, group_id, rollout_id, workflow_id
    from durable_rollouts.models import RolloutResult, Task
    from durable_rollouts.workflows.batch_stops import BatchStops
    from durable_rollouts.workflows.fan_out import FanOut, part_slices
    from durable_rollouts.workflows.rollout_children import KEY_STATUS, PATCH_OUTLIVE, RolloutChildren
    from durable_rollouts.workflows.stream import StreamState
    from durable_rollouts.workflows.stream_handlers import StreamHandlers
    from durable_rollouts.workflows.stream_parts import MAX_SIGNALS_PER_RUN, StreamParts
    from durable_rollouts.workflows.types import (
        ACT_LOAD_ROWS,
        ACT_RESOLVE,
        ACT_STORE_RESULTS,
        ERROR_STATUSES,
        AwaitedRollout,
        CarriedRollout,
        LoadRowsInput,
        Progress,
        ResolveGroupInput,
        ResultsRef,
        StoreResultsInput,
        TasksetRunInput,
        TasksetRunResult,
    )

__all__ = ["TasksetRun", "child_id", "group_id", "rollout_id", "workflow_id"]

FLUSH_CHUNK = 250  # results per stored chunk (keeps activity payloads well under 256 KB)
ROW_WINDOW = 250  # rows loaded per activity when the rows travel by claim check



# At most this many children start in one workflow task (a task must finish within the 2 s
# deadlock limit, also on a loaded box); then the run yields to a 1 ms timer.
STARTS_PER_TASK = 100
PATCH_EVENT_ORDER = "rollouts-in-event-order"  # rollouts counted in the order they ended
PATCH_DELIVER_WHILE_STARTING = "stream-deliver-while-starting"  # ``_tally_ended``
# A streamed run continues-as-new before it accepts this many updates (Temporal allows 2,000).
MAX_UPDATES_PER_RUN = 1000
PATCH_FINISH_IN_RUN = "finish-in-run"  # ``_worth_continuing``
EVENTS_PER_END = 4  # history events a running rollout's end adds, with margin (measured about 2)
FINISH_UNDER = 10_000  # events: a run with nothing left to start may finish if it stays under this


@workflow.defn(name="TasksetRun")
class TasksetRun(StreamHandlers, StreamParts, FanOut, RolloutChildren, BatchStops):
    """Run every row ``group`` times; return compact results (or claim checks for them)."""

    @workflow.init
    def __init__(self, inp: TasksetRunInput) -> None:
        self._progress: Progress | None = None
        self._window: dict[int, Task] = {}
        self._failed_on: str | None = None  # on_error="fail": set by the first unrecovered error
        self._touched = False  # a consumer acted (the linger timer starts again)
        self._ended: dict[str, int] = {}  # rollout id -> its place in the order rollouts ended
        self._event_order: bool | None = None  # PATCH_EVENT_ORDER, decided at the first count
        self._inp = inp  # the run's input; an add (``stream_add``) grows its rows in place
        self._flying: dict[str, CarriedRollout] = {}
        self._starting: set[str] = set()
        self._finish_here: bool | None = None  # ``_worth_continuing``'s decision, once made
        self._waits: dict[str, int] = {}  # each consumer's latest stream_wait
        self._awaited: dict[str, asyncio.Future[AwaitedRollout]] = {}
        self._init_parts(inp)  # a streamed batch run as parts: those a previous run left running
        # Set here, not in run: an update in the first workflow task (a consumer registering
        # or acking right after start) is validated before run begins.
        self._policy = inp.policy
        self._stream = inp.stream_state
        if self._stream is None and inp.stream is not None:  # the batch's first run
            self._stream = StreamState(options=inp.stream, on_error=inp.on_error,
                                       cursors={name: 0 for name in inp.stream.consumers})

    @workflow.query
    def progress(self) -> Progress:
        return self._progress or Progress(job_id="", total=0)

    @workflow.run
    async def run(self, inp: TasksetRunInput) -> TasksetRunResult:
        inp = self._inp  # the same input; an add taken before run began already grew it
        # A streamed batch drains before continuing as new: with rollouts outliving its runs, a
        # 20,000-rollout stream measured worse delivery lag (benchmarks/README.md, 2026-12-06).
        self._outlive = inp.stream is None and workflow.patched(PATCH_OUTLIVE)
        total = self._total(inp)
        first = inp.next_index if inp.part is not None else 0  # a part counts its own slots
        progress = inp.progress or Progress(job_id=inp.job_id, batch_index=inp.batch_index,
                                            total=0 if inp.open_ended else total - first)
        if inp.progress is not None:
            progress.runs += 1
        progress.running = 0
        self._progress = progress
        self._start_paging()
        resolved: dict[int, Task] = dict(inp.resolved)
        results: list[RolloutResult] = list(inp.results)
        refs: list[ResultsRef] = list(inp.result_refs)
        self._set_status(inp, "running")

        index = inp.next_index
        pending = self._carry_in(inp)  # what the previous run left running
        progress.running = len(pending)
        slices = part_slices(inp, index, total)  # wider than one workflow holds: run it as parts
        width = inp.max_concurrent  # a streamed batch's own rollouts (after its parts): one workflow's
        if inp.stream is not None and inp.children_per_workflow is not None:
            width = min(width, inp.children_per_workflow)
        try:
            if self._stream is not None and (slices or self._parts):  # parts feed the one stream
                if await self._run_stream_parts(inp, slices, results, refs):
                    await self._continue_as_new(inp, total, results, refs, resolved, progress, pending)
                index = total
            elif slices:
                await self._run_parts(inp, slices, resolved, results, refs)
                index = total
            if index == total and (slices or inp.parts):
                if len(results) > inp.flush_results_over:  # the parts' inline results: claim checks
                    refs.extend(await self._flush_all(inp, results, len(refs)))
                    results = []
            while self._more(index, total := self._until(inp, index, self._total(inp))) or pending:
                if self._failed_on is not None:  # on_error="fail": cancel the rest (teardown runs)
                    index = await self._fail_rest(inp, pending, index, total, results)
                    pending = []
                    break
                starts = 0  # child starts in this workflow task: a bounded number (then yield)
                while len(pending) < width and not self._too_long(inp):
                    if starts >= STARTS_PER_TASK and workflow.patched("paced-child-starts"):
                        await workflow.sleep(0.001)
                        starts = 0
                        pending = self._tally_ended(inp, pending, results)
                    slot = self._next_slot(inp, index, total)
                    if slot is None or not self._may_start(inp, slot):
                        break  # nothing left to start, or the consumers are behind
                    row_index, group_index, resample = slot
                    row = await self._row(inp, row_index)
                    task = resolved.get(row_index)
                    if task is None:
                        try:
                            task = await self._resolve(inp, row)
                        except ActivityError as err:  # the whole group fails, the batch goes on
                            index = self._group_unresolved(inp, row, slot, index, total, err, results)
                            if self._failed_on is not None:
                                break
                            continue
                        resolved[row_index] = task
                    rollout = asyncio.ensure_future(
                        self._rollout(inp, task, row.slug, row_index, group_index, resample))
                    pending.append(rollout)
                    index = self._consume(slot, index)
                    progress.started += 1
                    progress.running += 1
                    starts += 1
                if inp.open_ended:  # its total: the rollouts started so far, and re-samples to come
                    progress.total = progress.started + (len(self._stream.slots) if self._stream else 0)
                if self._failed_on is not None:
                    continue  # cancel the rest at the top of the loop
                if self._outlive and pending and self._too_long(inp) and self._worth_continuing(
                        inp, index, total, pending):
                    break  # continue as new now: the next run awaits the rollouts still running
                if not pending:
                    if self._held(index, total, inp):  # wait for an ack (or a long history)
                        await workflow.wait_condition(
                            lambda: not self._held(index, self._until(inp, index, self._total(inp)), inp))
                        continue
                    break
                await self._collect(inp, pending, results, gate=self._held_back(index, total))
                pending = [fut for fut in pending if not fut.done()]
                self._forward(inp)  # a part of a streamed batch: what it finished, to the batch
                await self._page_out(inp)
                self._details(progress)
        except asyncio.CancelledError:
            await self._cancel_children(inp, pending)
            await self._report_done(inp, TasksetRunResult(job_id=inp.job_id, batch_index=inp.batch_index,
                                                          progress=progress))
            raise

        # History is getting long, or rows were added (the next run's input then names them, for
        # every reader of the job): carry state into a fresh run.
        carry = self._more(index, self._until(inp, index, self._total(inp))) or self._grew or bool(pending)
        if not carry and self._stream is not None and self._failed_on is None:
            self._rollouts_done = True
            carry = await self._linger(inp)  # consumers catch up (True: continue as new first)
        if carry:
            await self._continue_as_new(inp, index, results, refs, resolved, progress, pending)
        await self._seal(inp)  # a paged stream: the rest of it, and the cursors, to storage

        progress.done = True
        self._details(progress)
        self._set_status(inp, "completed" if self._failed_on is None else "failed")
        if inp.forward_to is not None and len(results) > inp.flush_results_over:  # a signal's payload
            refs.extend(await self._flush_all(inp, results, len(refs)))
            results = []
        outcome = TasksetRunResult(job_id=inp.job_id, job_name=inp.job_name, batch_index=inp.batch_index,
                                   on_error=inp.on_error, failed_on=self._failed_on,
                                   progress=progress, results=results, result_refs=refs)
        await self._report_done(inp, outcome)  # a part of a streamed batch: to the batch
        return outcome

    async def _continue_as_new(self, inp: TasksetRunInput, index: int, results: list[RolloutResult],
                               refs: list[ResultsRef], resolved: dict[int, Task], progress: Progress,
                               pending: list[asyncio.Task[RolloutResult]]) -> None:
        """Flush the results to claim checks (when many) and continue as new from ``index``,
        carrying the rollouts still running (``pending``: only under ``PATCH_OUTLIVE``)."""
        self._leaving = self._handing_over = True  # consumers waiting here wait on the next run
        await self._page_out(inp)  # carry only the groups not every consumer acknowledged
        if len(results) > inp.flush_results_over:  # claim checks of <=FLUSH_CHUNK results each
            refs = [*refs, *await self._flush_all(inp, results, len(refs))]
            results = []
        # An add's rows are in ``inp``; every carried rollout's child has started (it exists). The
        # wait also lets every rollout whose child ended in this workflow task finish first, so
        # each one whose end is in this run's history is counted here, not carried.
        def settled() -> bool:
            return workflow.all_handlers_finished() and not self._starting

        counted: set[asyncio.Task[RolloutResult]] = set()
        while True:  # a part waits for its batch to take what it counted: count what ended meanwhile
            await workflow.wait_condition(settled)
            while not settled():
                await workflow.wait_condition(settled)
            ended = [f for f in pending if f.done() and f not in counted]
            self._tally(inp, ended, results)  # ended meanwhile: count them
            counted.update(ended)
            if inp.forward_to is None or not (self._outbox or self._sends):
                break
            await self._forwarded(inp)  # a part: its batch has every result it counted
        carry = inp.model_copy(update={
            "next_index": index, "results": results, "result_refs": refs,
            # only groups that still have rollouts to start need their resolved task
            "resolved": {r: t for r, t in resolved.items()
                         if index < self._total(inp) and r >= self._slot(inp, index)[0]},
            "progress": progress, "stream_state": self._stream, "policy": self._policy,
            "carried": list(self._flying.values()), "parts": list(self._parts.values()),
        })
        workflow.continue_as_new(carry)

    def _count(self, inp: TasksetRunInput, result: RolloutResult) -> None:
        """Count a final result; under on_error="fail" the first error marks the batch failed.
        A streamed batch also hands it to its group (which may finish, or be re-sampled)."""
        assert self._progress is not None
        self._progress.count(result)
        if inp.on_error == "fail" and result.status in ERROR_STATUSES and self._failed_on is None:
            self._failed_on = result.rollout_id
        if inp.forward_to is not None:  # a part of a streamed batch: its batch judges the group
            self._outbox.append(result)
        if self._stream is not None:
            before = len(self._stream.slots)
            self._stream.finish(result, self._policy)
            self._progress.total += len(self._stream.slots) - before  # a re-sampled group's rollouts

    @staticmethod
    def _slot(inp: TasksetRunInput, index: int) -> tuple[int, int]:
        """(row_index, group_index) of the index-th rollout: task-major, or the resume list."""
        if inp.only is not None:
            row_index, group_index = inp.only[index]
            return row_index, group_index
        return divmod(index, inp.group)  # type: ignore[return-value]

    async def _collect(self, inp: TasksetRunInput, pending: list[asyncio.Task[RolloutResult]],
                       results: list[RolloutResult], gate: bool = False) -> None:
        """Wait for a rollout to finish (or, with ``gate``: consumers hold a new group back, for
        the ack that lets it start) and count what finished."""
        assert self._progress is not None
        waits: list[asyncio.Future[Any]] = list(pending)
        ack = None
        if gate:  # never when a group may start already: the wait would return at once, forever
            ack = asyncio.ensure_future(workflow.wait_condition(self._may_open_group))
            waits.append(ack)
        stop = None
        if inp.part is not None and self._failed_on is None:  # a sibling part's stop_batch wakes us
            stop = asyncio.ensure_future(workflow.wait_condition(lambda: self._failed_on is not None))
            waits.append(stop)
        grown = None
        if self._stream is not None:  # rows added (``stream_add``) may start in the free slots
            seen = self._additions
            grown = asyncio.ensure_future(workflow.wait_condition(lambda: self._additions != seen))
            waits.append(grown)
        done, _ = await workflow.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for cond in (ack, stop, grown):
            if cond is not None and not cond.done():
                cond.cancel()
        self._tally(inp, [f for f in done if f is not ack and f is not stop and f is not grown], results)

    def _worth_continuing(self, inp: TasksetRunInput, index: int, total: int,
                          pending: list[asyncio.Task[RolloutResult]]) -> bool:
        """Whether a run whose history grew long continues as new with ``pending`` still running.
        Not when nothing is left to start, the server's suggestion (not ``max_history_events``)
        is what says long, and their ends keep the history under ``FINISH_UNDER`` events (decided
        once): the new run would only await them, and each end that arrives while the
        continue-as-new command is in flight fails that workflow task (Temporal's
        UnhandledCommand); a worker replaying a long history under load lost that race again and
        again (a part of 1,000 waiting agents closed 5-11 s after its last child). Earlier
        histories continued as new here."""
        if self._more(index, total):
            return True
        length = workflow.info().get_current_history_length()
        if self._finish_here is None:
            self._finish_here = (length <= inp.max_history_events
                                 and length + EVENTS_PER_END * len(pending) < FINISH_UNDER
                                 and workflow.patched(PATCH_FINISH_IN_RUN))
        return not self._finish_here or length >= FINISH_UNDER

    def _tally_ended(self, inp: TasksetRunInput, pending: list[asyncio.Task[RolloutResult]],
                     results: list[RolloutResult]) -> list[asyncio.Task[RolloutResult]]:
        """Between two paced bursts of child starts (hundreds after a continue-as-new; each pause
        is a 1 ms timer, which the dev server fires about a second later), a streamed batch counts
        the rollouts that ended meanwhile, so their groups reach the consumers then, not after
        the last start. Returns the rollouts still running."""
        ended = [f for f in pending if f.done()]
        if self._stream is None or not ended or not workflow.patched(PATCH_DELIVER_WHILE_STARTING):
            return pending
        self._tally(inp, ended, results)
        return [f for f in pending if not f.done()]  # (``f not in ended`` is quadratic)

    def _tally(self, inp: TasksetRunInput, done: list[asyncio.Task[RolloutResult]],
               results: list[RolloutResult]) -> None:
        """Count the rollouts in ``done`` (each ended), in the order they ended."""
        assert self._progress is not None
        for fut in self._in_order(done):
            result = fut.result()
            results.append(result)
            self._progress.running -= 1
            self._count(inp, result)

    def _in_order(self, done: list[asyncio.Task[RolloutResult]]) -> list[asyncio.Task[RolloutResult]]:
        """``done`` in the order their rollouts ended: the order their ends came in history (a
        child's completion event; for a rollout a previous run carried in, its place in the
        ``await_rollouts`` result), whichever workflow task delivered them. Each end is numbered by
        the first code that runs once it is in history (``_mark_ended``), the same number of steps
        after its event for a child and for a carried rollout, so a stream's group order (what
        consumers are handed, by position) never depends on how events were batched into tasks:
        a worker that replays the history after a kill hands out the same sequence. Runs before
        the patch: by rollout id within each wake-up, as they were recorded."""
        if self._event_order is None:
            self._event_order = workflow.patched(PATCH_EVENT_ORDER)
        if not self._event_order:
            return sorted(done, key=lambda f: f.result().rollout_id)
        return sorted(done, key=lambda f: (  # (math.inf never: every ended rollout was numbered)
            self._ended.pop(f.result().rollout_id, math.inf), f.result().rollout_id))

    def _until(self, inp: TasksetRunInput, index: int, total: int) -> int:
        """The batch's slots: ``total``; an open-ended one (``epochs=None``) ends with the group
        it is in once its stream was closed (``job.close()``) or ``on_error="fail"`` stopped it."""
        if not inp.open_ended:
            return total
        if self._failed_on is None and not (self._stream is not None and self._stream.closed):
            return total
        return min(total, -(-index // inp.group) * inp.group)

    @classmethod
    def _total(cls, inp: TasksetRunInput) -> int:
        """How many rollouts the batch's own slots are (re-sampled groups come on top)."""
        if inp.only is not None:
            return len(inp.only)
        return inp.stop_index if inp.stop_index is not None else cls._row_count(inp) * inp.group

    @staticmethod
    def _row_count(inp: TasksetRunInput) -> int:  # positions (rows x epochs), added rows included
        return inp.total_rows if inp.rows_ref is not None and inp.total_rows is not None else len(inp.rows)

    async def _row(self, inp: TasksetRunInput, index: int) -> Task:
        if inp.rows_ref is None:
            return inp.rows[index]
        if index not in self._window:  # rows are consumed in order: load the next window
            stop = min(index + ROW_WINDOW, self._row_count(inp))
            rows = await workflow.execute_activity(
                ACT_LOAD_ROWS, LoadRowsInput(uri=inp.rows_ref, start=index, stop=stop),
                result_type=list[Task], start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=20),
            )
            self._window = dict(zip(range(index, stop), rows))
        return self._window[index]

    def _too_long(self, inp: TasksetRunInput) -> bool:
        # Continue-as-new well before the 10,240-event warning (and the 2,000 pending-children cap,
        # and the 2,000 updates a run may take).
        info = workflow.info()
        return (info.is_continue_as_new_suggested() or info.get_current_history_length() > inp.max_history_events
                or self._stream_updates > MAX_UPDATES_PER_RUN or self._signals_in > MAX_SIGNALS_PER_RUN)

    async def _resolve(self, inp: TasksetRunInput, row: Task) -> Task:
        if inp.taskset_class is None:  # plain Taskset: resolve_task is the identity
            return row
        return await workflow.execute_activity(
            ACT_RESOLVE, ResolveGroupInput(taskset_name=inp.taskset_name, taskset_class=inp.taskset_class,
                                           task=row),
            result_type=Task, start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["ConfigError"]),
        )

    async def _flush_all(self, inp: TasksetRunInput, results: list[RolloutResult], first: int) -> list[ResultsRef]:
        """``results`` to claim checks of at most ``FLUSH_CHUNK`` each, numbered from ``first``."""
        return [await self._flush(inp, results[start:start + FLUSH_CHUNK], first + n)
                for n, start in enumerate(range(0, len(results), FLUSH_CHUNK))]

    async def _flush(self, inp: TasksetRunInput, results: list[RolloutResult], chunk: int) -> ResultsRef:
        return await workflow.execute_activity(
            ACT_STORE_RESULTS, StoreResultsInput(job_id=inp.job_id, batch_index=inp.batch_index,
                                                 chunk=chunk, results=results),
            result_type=ResultsRef, start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=20),
        )

    def _details(self, p: Progress) -> None:
        mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
        workflow.set_current_details(
            f"**{p.finished}/{p.total}** done, {p.running} running  \n"
            f"succeeded {p.succeeded} · failed {p.failed} · errored {p.errored} · "
            f"timeout {p.timeout} · cancelled {p.cancelled}  \nmean reward {mean}"
        )

    def _set_status(self, inp: TasksetRunInput, status: str) -> None:
        if inp.search_attributes:
            workflow.upsert_search_attributes([KEY_STATUS.value_set(status)])
