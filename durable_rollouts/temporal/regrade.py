"""Read a job's saved rollouts for a re-grade (``Taskset.replay(job_id)``, ``rollouts regrade JOB``).

``sdk.replay`` looks this module up by name, so the sdk never imports the Temporal layer. Every
batch of the job is read through ``temporal.jobs.load_job`` with traces (the answers are in
them); the runtime of its first batch is the re-grade's default. Imports temporalio's client, the
job reader and the sdk's saved-rollout model.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client

from ..models import ProviderSpec
from ..sdk.saved_rollouts import SavedRollout, from_run
from .jobs import connect, load_job

__all__ = ["saved_job"]


async def saved_job(job_id: str, temporal: Any = None) -> tuple[str, list[SavedRollout], ProviderSpec]:
    """(name, saved rollouts, runtime spec) of job ``job_id``.

    ``temporal``: a Client, an address, or None (``$ROLLOUTS_TEMPORAL_ADDRESS``, else the
    embedded server).

    Raises:
        ConfigError: no job with that id, or no Temporal reachable.
    """
    client = temporal if isinstance(temporal, Client) else await connect(temporal)
    view = await load_job(client, job_id, traces=True)
    saved = [from_run(run, view.job_id) for run in view.runs]
    return view.name, saved, view.batches[0].input.provider
