"""The ids of a job's workflows and rollouts: pure functions, shared by workflows, starters and readers.

A batch is ``job-<job_id>`` (``-b<n>`` for later batches of an open job); a rollout's stable id
is ``job-<job_id>-<slug>-<group index>`` (with the batch suffix), also the workflow id of its
first ``Rollout`` child; a fresh re-run's child adds ``-r<n>``, a re-sampled group's rollouts
``-s<n>`` (a new sample of the same task, so a new rollout).
"""

from __future__ import annotations

__all__ = ["batch_of", "child_id", "group_id", "rollout_id", "shard_id", "workflow_id"]


def _suffix(batch_index: int) -> str:
    return f"-b{batch_index}" if batch_index else ""


def workflow_id(job_id: str, batch_index: int = 0) -> str:
    """Workflow id of a job's batch: ``job-<job_id>`` (``-b<n>`` for later batches)."""
    return f"job-{job_id}{_suffix(batch_index)}"


SHARD_MARK = "/part-"


def shard_id(batch_workflow_id: str, shard: int) -> str:
    """Workflow id of part ``shard`` of a batch wider than one workflow may hold
    (``workflows.fan_out``): ``<batch workflow id>/part-<n>`` (no rollout id has a ``/``)."""
    return f"{batch_workflow_id}{SHARD_MARK}{shard}"


def batch_of(workflow_id: str) -> str:
    """The batch a TasksetRun workflow id belongs to: itself, or the batch a part is of."""
    return workflow_id.split(SHARD_MARK, 1)[0]


def rollout_id(job_id: str, slug: str, group_index: int, batch_index: int = 0, resample: int = 0) -> str:
    """Stable rollout id (also the Rollout child's workflow id and the substrate key)."""
    return f"job-{job_id}-{slug}-{group_index}{_suffix(batch_index)}" + (f"-s{resample}" if resample else "")


def child_id(rollout_id: str, retry: int = 0) -> str:
    """Workflow id of a rollout's Rollout child: the rollout id, ``-r<n>`` for the n-th fresh re-run."""
    return rollout_id if retry == 0 else f"{rollout_id}-r{retry}"


def group_id(job_id: str, row_index: int, batch_index: int = 0, resample: int = 0) -> str:
    """The id the rollouts of one row share (a re-sampled group gets ``-s<n>``)."""
    return f"{job_id}-g{row_index}{_suffix(batch_index)}" + (f"-s{resample}" if resample else "")
