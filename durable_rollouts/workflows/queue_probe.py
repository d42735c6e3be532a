"""Busy or lost: is a substrate's queue that kept a step waiting still polled by a live worker?

A step pinned to a substrate's own queue (the provisioning worker's host or process queue) that
is not picked up within the queue timeout (schedule-to-start) means either that worker is gone,
or it is alive with every activity slot taken. A worker with full slots stops polling, so the
queue's pollers cannot tell the two apart; instead every worker also polls a small liveness
queue per extra queue (:func:`alive_queue`, a separate poller with its own slots), and the
workflow asks it: a probe that runs there means busy (schedule the step again), one that is not
picked up within ``wait`` means lost (reprovision).

Deterministic: imports only temporalio and ``workflows.types``. The probe is new in this
release's command sequence, behind the ``busy-queue-probe`` patch, so histories recorded before
it replay as they were (a schedule-to-start timeout there counted as lost).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from durable_rollouts.workflows.types import ACT_QUEUE_ALIVE

__all__ = ["PATCH_BUSY_QUEUE", "PROBE_WAIT", "alive_queue", "queue_polled"]

PATCH_BUSY_QUEUE = "busy-queue-probe"
PROBE_WAIT = timedelta(seconds=10)  # at most this long for a live worker to pick the probe up


def alive_queue(queue: str) -> str:
    """The liveness queue polled alongside ``queue`` by every worker that polls ``queue``."""
    return f"{queue}:alive"


async def queue_polled(queue: str, wait: timedelta) -> bool:
    """True when a live worker polls ``queue``: the probe on its liveness queue ran within
    ``wait`` (at most ``PROBE_WAIT``). False when nobody picked it up, or in a replay of a
    history recorded before the probe existed."""
    if not workflow.patched(PATCH_BUSY_QUEUE):
        return False
    wait = min(wait, PROBE_WAIT)
    try:
        await workflow.execute_activity(
            ACT_QUEUE_ALIVE, task_queue=alive_queue(queue), summary="queue alive?",
            schedule_to_start_timeout=wait, start_to_close_timeout=wait,
            retry_policy=RetryPolicy(maximum_attempts=1))
    except ActivityError:
        return False
    return True
