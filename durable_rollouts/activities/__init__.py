"""Temporal activities: resolve, provision, connect, start, agent, grade, verify, teardown.

Classes built with their dependencies; each activity is a thin wrapper over
``durable_rollouts.steps.substrate`` with errors mapped at one edge (``failures``). Workflows never
import this package (they reference activities by name).
"""

from __future__ import annotations

from durable_rollouts.activities.rollout import Queues, RolloutActivities
from durable_rollouts.activities.taskset import TasksetActivities

__all__ = ["Queues", "RolloutActivities", "TasksetActivities"]
