"""Starting one rollout of a batch: its ``Rollout`` child (and fresh re-runs under ``retries``).

A mixin of ``TasksetRun``. A rollout's id derives from its row's slug, group index and batch (stable
for resume); each fresh re-run is a new child (``-r<n>``) on a new substrate. The child starts with
its Web UI summary and its search attributes (``RolloutsStatus`` already ``running``); a child that
fails or is cancelled becomes a result, not an error of the batch.

Deterministic: stdlib, temporalio and the workflow models only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from durable_rollouts.ids import child_id, group_id, rollout_id
    from durable_rollouts.models import RetryAttempt, RolloutResult, Task
    from durable_rollouts.workflows.rollout import Rollout
    from durable_rollouts.workflows.types import (
        CARD_LAYOUT,
        RETRYABLE_STATUSES,
        RolloutInput,
        TasksetRunInput,
    )

__all__ = ["KEY_JOB_ID", "KEY_STATUS", "KEY_TASK_SLUG", "RolloutChildren"]

KEY_JOB_ID = SearchAttributeKey.for_keyword("RolloutsJobId")
KEY_TASK_SLUG = SearchAttributeKey.for_keyword("RolloutsTaskSlug")
KEY_STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")


class RolloutChildren:
    """Runs one rollout of the batch as its ``Rollout`` child (the workflow sets the fields)."""

    _policy: Any = None  # the policy new rollouts sample with (the stream handlers set it)
    _failed_on: str | None = None

    async def _rollout(self, inp: TasksetRunInput, task: Task, row_slug: str, row_index: int,
                       group_index: int, resample: int = 0) -> RolloutResult:
        # The id uses the row's slug (known before resolution), so it is stable for resume.
        rid = rollout_id(inp.job_id, row_slug, group_index, inp.batch_index, resample)
        gid = group_id(inp.job_id, row_index, inp.batch_index, resample)
        earlier: list[RetryAttempt] = []
        retry = 0
        while True:
            result = await self._rollout_once(inp, task, rid, gid, row_index, group_index, retry)
            # Fresh re-runs (new child, new substrate key) only for inputs that ask for them.
            if (result.status not in RETRYABLE_STATUSES or retry >= inp.retries
                    or self._failed_on is not None or not workflow.patched("taskset-run-retries")):
                break
            earlier.append(RetryAttempt(
                workflow_id=child_id(rid, retry), status=result.status, reward=result.reward,
                error=result.error, error_phase=result.error_phase))
            retry += 1
        if earlier:
            result.rollout_id = rid  # results keep the stable id (resume, latest-wins merging)
            result.retries = retry
            result.retry_history = earlier
        return result

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
        try:
            return await workflow.execute_child_workflow(
                Rollout.run, child, id=wid, task_queue=inp.task_queue,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL, search_attributes=attrs,
                static_summary=summary,
            )
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
