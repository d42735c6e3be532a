"""Which task queue a batch runs on (issue #39, item 4: two experiments never cross).

A process that runs its own in-process worker for a batch (``Taskset.run``, ``Taskset.start``,
``rollouts run`` on the embedded server, or ``worker=True``) gets a queue of its own, one per job:
``rollouts-job-<job id>``. Its worker polls only that queue, so two scripts on one embedded server
each run only their own rollouts (and an agent class from one script's ``__main__`` never reaches
the other). Every batch of the job, a resume (``rollouts resume`` polls each batch's recorded
queue) and ``Job.attach`` use the queue the batch recorded in its input, so whoever picks the job up
again polls the right queue.

A queue chosen on purpose (``task_queue=``, ``--task-queue`` or ``$ROLLOUTS_TASK_QUEUE``) is used
as given: that is how a batch is shared with ``rollouts worker`` processes for scale-out. A batch
without an in-process worker (a ``--temporal`` cluster) runs on the shared queue, where the
cluster's workers poll.
"""

from __future__ import annotations

import os

from ..settings import settings, var
from ..workflows.types import DEFAULT_TASK_QUEUE

__all__ = ["batch_queue", "chosen_queue", "job_queue"]


def job_queue(job_id: str) -> str:
    """The queue of one job's own workers: ``rollouts-job-<job id>``."""
    return f"{DEFAULT_TASK_QUEUE}-job-{job_id}"


def chosen_queue(task_queue: str | None = None) -> str | None:
    """The queue the caller chose: ``task_queue``, else ``$ROLLOUTS_TASK_QUEUE`` if set, else None."""
    if task_queue:
        return task_queue
    if os.environ.get(var("task_queue")):
        return settings().task_queue
    return None


def batch_queue(task_queue: str | None, *, job_id: str, in_process: bool) -> str:
    """The queue a new batch of ``job_id`` runs on: the chosen one, else the job's own queue
    when this process runs its worker, else the shared queue (``$ROLLOUTS_TASK_QUEUE`` or
    ``rollouts``)."""
    chosen = chosen_queue(task_queue)
    if chosen is not None:
        return chosen
    return job_queue(job_id) if in_process else settings().task_queue
