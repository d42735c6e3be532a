"""Resume a job: re-run only the selected rollouts of each batch, keeping every other result.

For each closed batch with selected rollouts, a new run of the same ``TasksetRun`` workflow id
starts (so it is found by the job id and carries the same search attributes) with
``only=[(row, group_index), ...]`` and the kept results. Rollout ids derive from the job id, the
row's slug and the group index, so a re-run rollout keeps its id and replaces its old result
(latest wins); nothing is matched by comparing configs. Imports temporalio, the workflow names
and models, and ``temporal.jobs`` / ``temporal.select``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client

from ..errors import ConfigError
from ..models import RolloutResult, Task
from ..release import MEMO_KEY, release_name
from ..sdk.run import Run
from ..workflows import TasksetRun, rollout_id
from ..workflows.types import Progress, ResultsRef
from .jobs import BatchView, JobView, child_task
from .select import selected

__all__ = ["INLINE_KEPT_MAX", "ResumePlan", "plan_resume", "start_resume"]

INLINE_KEPT_MAX = 500
"""Kept results above this many travel as a claim-checked chunk, not in the workflow input."""


@dataclass
class ResumePlan:
    batch: BatchView
    rerun: list[Run]
    kept: list[RolloutResult]

    @property
    def total(self) -> int:
        return len(self.batch.rows) * self.batch.input.group


def plan_resume(view: JobView, only: frozenset[str] | None) -> list[ResumePlan]:
    """What to re-run in each batch (batches with nothing selected are left out).

    Raises:
        ConfigError: a batch is still running, or a rollout of it is still shutting down.
    """
    busy = [b.workflow_id for b in view.batches if b.status == "running"]
    if busy:
        raise ConfigError(
            f"job {view.job_id} is still running ({', '.join(busy)}): wait for it, "
            f"or stop it with `rollouts cancel {view.job_id}` first"
        )
    plans = []
    for batch in view.batches:
        stuck = [r.rollout_id for r in batch.runs if r.status == "cancelling"]
        if stuck:
            raise ConfigError(f"rollout {stuck[0]} is still shutting down; try again in a moment")
        rerun = selected(batch.runs, only)
        if not rerun:
            continue
        ids = {r.rollout_id for r in rerun}
        kept = [r.to_result() for r in batch.runs if r.rollout_id not in ids]
        plans.append(ResumePlan(batch=batch, rerun=rerun, kept=kept))
    return plans


async def _resolved(client: Client, job_id: str, plan: ResumePlan) -> dict[int, Task]:
    """Groups keep the task their first rollouts ran (read from a Rollout child's input)."""
    inp = plan.batch.input
    if inp.taskset_class is None:
        return {}
    out: dict[int, Task] = {}
    for row in sorted({r.row_index for r in plan.rerun}):
        for gi in range(inp.group):
            task = await child_task(
                client, rollout_id(job_id, plan.batch.rows[row].slug, gi, inp.batch_index)
            )
            if task is not None:
                out[row] = task
                break
    return out


def _carry(
    job_id: str, batch_index: int, kept: list[RolloutResult]
) -> tuple[list[RolloutResult], list[ResultsRef]]:
    if len(kept) <= INLINE_KEPT_MAX:
        return kept, []
    from ..stores.results import ResultStore

    # A chunk number no flush of the new run uses (those count up from len(result_refs)).
    chunk = int(time.time() * 1000) % 1_000_000_000 + 1_000_000
    return [], [ResultStore().put(job_id, batch_index, chunk, kept)]


async def start_resume(
    client: Client,
    job_id: str,
    plan: ResumePlan,
    *,
    retries: int | None = None,
    on_error: str | None = None,
) -> Any:
    """Start the new run of ``plan.batch`` and return its workflow handle.

    The batch keeps its own ``retries``/``on_error`` policy unless they are given here.
    """
    old = plan.batch.input
    progress = Progress(
        job_id=job_id, batch_index=old.batch_index, total=plan.total, started=len(plan.kept), runs=0
    )
    for result in plan.kept:
        progress.count(result)
    results, refs = _carry(job_id, old.batch_index, plan.kept)
    only = sorted((r.row_index, r.group_index) for r in plan.rerun)
    inp = old.model_copy(
        update={
            "next_index": 0,
            "only": [list(slot) for slot in only],
            "results": results,
            "result_refs": refs,
            "resolved": await _resolved(client, job_id, plan),
            "progress": progress,
            "retries": old.retries if retries is None else retries,
            "on_error": old.on_error if on_error is None else on_error,
        }
    )
    attrs = plan.batch.search_attributes
    return await client.start_workflow(
        TasksetRun.run,
        inp,
        id=plan.batch.workflow_id,
        task_queue=old.task_queue,
        search_attributes=attrs if attrs is not None and len(attrs) else None,
        memo={**(plan.batch.memo or {}), MEMO_KEY: release_name()},  # this run's starter
        static_summary=f"{old.job_name}: resume {len(only)} of {plan.total} rollouts",
    )
