"""The liveness probe a worker answers on each of its extra queues' liveness queues.

``workflows.queue_probe`` schedules it when a step waited too long on a substrate's own queue:
that it runs at all says a live worker polls the queue (its slots are merely full). Needs no
dependencies; kept apart from the step activities so its worker has its own slot and poller.
"""

from __future__ import annotations

from temporalio import activity

from durable_rollouts.workflows.types import ACT_QUEUE_ALIVE

__all__ = ["LIVENESS_SLOTS", "queue_alive"]

LIVENESS_SLOTS = 4  # probes are instant; a few slots keep them from ever queueing behind each other


@activity.defn(name=ACT_QUEUE_ALIVE)
async def queue_alive() -> None:
    """Nothing to do: being run is the answer."""
