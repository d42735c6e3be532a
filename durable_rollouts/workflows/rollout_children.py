"""Starting one rollout of a batch: its ``Rollout`` child (and fresh re-runs under ``retries``).

A mixin of ``TasksetRun``. A rollout's id derives from its row's slug, group index and batch (stable
for resume); each fresh re-run is a new child (``-r<n>``) on a new substrate. The child starts with
its Web UI summary and its search attributes (``RolloutsStatus`` already ``running``); a child that
fails or is cancelled becomes a result, not an error of the batch.

Rollouts outlive the batch's runs (``PATCH_OUTLIVE``): children start with ``ABANDON`` as their
parent-close policy, so a run continues as new with rollouts still running; it carries each one
(``CarriedRollout``) and the next run awaits their results by activity (``ACT_AWAIT_ROLLOUTS``)
instead of the old run draining first. Runs recorded before the patch drain, as they did.

Deterministic: stdlib, temporalio and the workflow models only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import child_id, group_id, rollout_id
    from durable_rollouts.models import RetryAttempt, RolloutResult, Task
    from durable_rollouts.workflows.rollout import Rollout
    from durable_rollouts.workflows.types import (
        ACT_AWAIT_ROLLOUTS,
        CARD_LAYOUT,
        RETRYABLE_STATUSES,
        AwaitedRollout,
        AwaitRolloutsInput,
        CarriedRollout,
        RolloutInput,
        TasksetRunInput,
    )

__all__ = ["KEY_JOB_ID", "KEY_STATUS", "KEY_TASK_SLUG", "PATCH_OUTLIVE", "RolloutChildren"]

PATCH_OUTLIVE = "rollouts-outlive-runs"  # children abandoned at close, carried across continue-as-new

KEY_JOB_ID = SearchAttributeKey.for_keyword("RolloutsJobId")
KEY_TASK_SLUG = SearchAttributeKey.for_keyword("RolloutsTaskSlug")
KEY_STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")


class RolloutChildren:
    """Runs one rollout of the batch as its ``Rollout`` child (the workflow sets the fields)."""

    _policy: Any = None  # the policy new rollouts sample with (the stream handlers set it)
    _failed_on: str | None = None
    _outlive = False  # PATCH_OUTLIVE, decided when the run begins
    _flying: dict[str, CarriedRollout]  # every rollout running in this run, by rollout id
    _starting: set[str]  # rollouts whose child start is not confirmed yet
    _awaited: dict[str, asyncio.Future[AwaitedRollout]]  # carried rollouts, by workflow id
    _carried_ids: dict[str, str]  # carried rollouts' ids, by workflow id
    _waiter: asyncio.Task[None] | None = None  # the loop awaiting the carried rollouts
    _ended: dict[str, int]  # rollout id -> its place in the order rollouts ended (``_in_order``)
    _ends = 0

    def _mark_ended(self, rid: str) -> None:
        """Number the end of rollout ``rid`` (called first thing once its end is in history)."""
        self._ends += 1
        self._ended[rid] = self._ends

    async def _rollout(self, inp: TasksetRunInput, task: Task | None, row_slug: str, row_index: int,
                       group_index: int, resample: int = 0,
                       carried: CarriedRollout | None = None) -> RolloutResult:
        """``task`` is None only for a carried rollout that will not be re-run (no ``retries``)."""
        if carried is None:
            # The id uses the row's slug (known before resolution), so it is stable for resume.
            assert task is not None
            rid = rollout_id(inp.job_id, row_slug, group_index, inp.batch_index, resample)
            gid = group_id(inp.job_id, row_index, inp.batch_index, resample)
            flying = CarriedRollout(workflow_id=child_id(rid, 0), rollout_id=rid, group_id=gid,
                                    slug=task.slug, row_index=row_index, group_index=group_index,
                                    task=task if inp.retries else None)
        else:
            rid, gid, flying = carried.rollout_id, carried.group_id, carried
        earlier: list[RetryAttempt] = list(flying.earlier)
        retry = flying.retry
        self._flying[rid] = flying
        try:
            while True:
                if carried is not None and retry == carried.retry:
                    result = self._carried_result(carried, await self._carried_end(carried))
                else:
                    assert task is not None
                    flying.workflow_id, flying.retry, flying.earlier = child_id(rid, retry), retry, list(earlier)
                    result = await self._rollout_once(inp, task, rid, gid, row_index, group_index, retry)
                # Fresh re-runs (new child, new substrate key) only for inputs that ask for them.
                if (result.status not in RETRYABLE_STATUSES or retry >= inp.retries
                        or self._failed_on is not None or not workflow.patched("taskset-run-retries")):
                    break
                earlier.append(RetryAttempt(
                    workflow_id=child_id(rid, retry), status=result.status, reward=result.reward,
                    error=result.error, error_phase=result.error_phase))
                retry += 1
        finally:
            self._flying.pop(rid, None)
        if earlier:
            result.rollout_id = rid  # results keep the stable id (resume, latest-wins merging)
            result.retries = retry
            result.retry_history = earlier
        return result

    async def _carried_end(self, carried: CarriedRollout) -> AwaitedRollout:
        try:
            return await self._awaited[carried.workflow_id]
        except asyncio.CancelledError:
            if self._failed_on is None:  # the batch itself is being cancelled
                raise
            return AwaitedRollout(workflow_id=carried.workflow_id, cancelled=True,
                                  error=f"cancelled: on_error=fail stopped the batch after {self._failed_on} failed")

    @staticmethod
    def _carried_result(carried: CarriedRollout, ended: AwaitedRollout) -> RolloutResult:
        if ended.result is not None:
            return ended.result
        return RolloutResult(
            rollout_id=carried.rollout_id, slug=carried.slug, group_id=carried.group_id,
            group_index=carried.group_index, row_index=carried.row_index,
            status="cancelled" if ended.cancelled else "errored", error=ended.error,
            error_phase=None if ended.cancelled else "workflow")

    def _carry_in(self, inp: TasksetRunInput) -> list[asyncio.Task[RolloutResult]]:
        """The rollouts the previous run left running: a task each (as if started here), and one
        loop awaiting them all by activity."""
        if not inp.carried:
            return []
        self._awaited = {c.workflow_id: asyncio.get_running_loop().create_future() for c in inp.carried}
        self._carried_ids = {c.workflow_id: c.rollout_id for c in inp.carried}
        self._waiter = asyncio.ensure_future(self._await_carried(inp))
        return [asyncio.ensure_future(self._rollout(inp, c.task, c.slug, c.row_index, c.group_index,
                                                    carried=c)) for c in inp.carried]

    async def _stop_carried(self) -> None:
        """Cancel the rollouts a previous run carried in and wait until each has closed (the
        waiter's activity cancels them; their teardown runs)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
            await asyncio.gather(self._waiter, return_exceptions=True)

    async def _await_carried(self, inp: TasksetRunInput) -> None:
        """Hand each carried rollout its outcome as it closes (activities that return whichever
        closed, in the order they closed; cancelling one cancels the rollouts still running)."""
        waiting = [wid for wid, fut in self._awaited.items() if not fut.done()]
        longest = timedelta(seconds=inp.rollout_timeout_s) if inp.rollout_timeout_s else timedelta(days=7)
        while waiting:
            ended = await workflow.execute_activity(
                ACT_AWAIT_ROLLOUTS, AwaitRolloutsInput(workflow_ids=waiting), result_type=list[AwaitedRollout],
                start_to_close_timeout=longest + timedelta(hours=1), heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
            for outcome in ended:
                fut = self._awaited.get(outcome.workflow_id)
                if fut is not None and not fut.done():
                    self._mark_ended(self._carried_ids[outcome.workflow_id])
                    fut.set_result(outcome)
            waiting = [wid for wid in waiting if not self._awaited[wid].done()]

    async def _rollout_once(self, inp: TasksetRunInput, task: Task, rid: str, gid: str, row_index: int,
                            group_index: int, retry: int) -> RolloutResult:
        wid = child_id(rid, retry)
        # The child's input names the stable rollout id (its workflow id adds -r<retry>).
        child = RolloutInput(rollout_id=rid, job_id=inp.job_id, group_id=gid, group_index=group_index,
                             row_index=row_index, task=task, agent=inp.agent, provider=inp.provider,
                             rollout_timeout_s=inp.rollout_timeout_s, max_attempts=inp.max_attempts,
                             local_steps=inp.local_steps, ephemeral=inp.ephemeral,
                             task_queue=inp.task_queue, queue_timeout_s=inp.queue_timeout_s,
                             agent_heartbeat_s=inp.agent_heartbeat_s, worker_watch=inp.worker_watch,
                             search_attributes=inp.search_attributes, retry=retry, policy=self._policy,
                             status_at_start=inp.search_attributes, layout=CARD_LAYOUT,
                             admission=inp.admission)
        attrs = None
        if inp.search_attributes:  # the child's status starts as running: one upsert less per child
            attrs = TypedSearchAttributes([SearchAttributePair(KEY_JOB_ID, inp.job_id),
                                           SearchAttributePair(KEY_TASK_SLUG, task.slug),
                                           SearchAttributePair(KEY_STATUS, "running")])
        # Web UI summary: task, group index, attempt (the first attempt keeps the old text).
        summary = f"{task.slug} #{group_index}" + (f" attempt {retry + 1}" if retry else "")
        close = ParentClosePolicy.ABANDON if self._outlive else ParentClosePolicy.REQUEST_CANCEL
        try:
            self._starting.add(rid)
            try:
                handle = await workflow.start_child_workflow(
                    Rollout.run, child, id=wid, task_queue=inp.task_queue, parent_close_policy=close,
                    search_attributes=attrs, static_summary=summary,
                )
            finally:
                self._starting.discard(rid)
            try:
                return await handle
            finally:
                self._mark_ended(rid)  # ended (or failed, or cancelled): first thing after its event
        except WorkflowAlreadyStartedError:  # e.g. left running by a terminated run of this batch
            return RolloutResult(
                rollout_id=rid, slug=task.slug, group_id=gid, group_index=group_index,
                row_index=row_index, status="errored", error_phase="workflow",
                error=f"a Rollout {wid} is running already (left by a terminated batch?): "
                      f"cancel it, then resume the job")
        except ChildWorkflowError as err:
            cause = err.cause
            cancelled = type(cause).__name__ == "CancelledError"
            return RolloutResult(
                rollout_id=rid, slug=task.slug, group_id=gid, group_index=group_index,
                row_index=row_index, status="cancelled" if cancelled else "errored",
                error=str(cause or err), error_phase=None if cancelled else "workflow",
            )
        except asyncio.CancelledError:
            if self._failed_on is None:  # the batch itself is being cancelled
                raise
            # on_error="fail" cancelled this rollout before its child started
            return RolloutResult(
                rollout_id=rid, slug=task.slug, group_id=gid, group_index=group_index,
                row_index=row_index, status="cancelled", attempts=0,
                error=f"cancelled: on_error=fail stopped the batch after {self._failed_on} failed")
