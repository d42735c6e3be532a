"""Temporal workflows only (deterministic): ``TasksetRun`` and its ``Rollout`` children.

Imports only the standard library, temporalio, pydantic and ``durable_rollouts.models``;
activities are referenced by name (see ``types``). Never import envserver, sdk or activities here:
``tests/temporal/test_workflow_purity.py`` checks it.
"""

from __future__ import annotations

from durable_rollouts.ids import child_id, group_id, rollout_id, workflow_id
from durable_rollouts.workflows.rollout import Rollout
from durable_rollouts.workflows.taskset_run import TasksetRun
from durable_rollouts.workflows.types import (
    DEFAULT_TASK_QUEUE,
    SEARCH_ATTRIBUTES,
    Progress,
    ResultsRef,
    RolloutInput,
    TasksetRunInput,
    TasksetRunResult,
)

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "Progress",
    "ResultsRef",
    "Rollout",
    "RolloutInput",
    "SEARCH_ATTRIBUTES",
    "TasksetRun",
    "TasksetRunInput",
    "TasksetRunResult",
    "child_id",
    "group_id",
    "rollout_id",
    "workflow_id",
]
