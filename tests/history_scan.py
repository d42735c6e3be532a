"""Raw workflow histories of a job, for the tests that scan them for secrets.

Importable from every test directory (``tests/`` is on pytest's ``pythonpath``, pyproject.toml).
"""

from __future__ import annotations

from typing import Any

from durable_rollouts.workflows import workflow_id


async def job_histories(client: Any, job: Any) -> bytes:
    """Raw protobuf bytes of every event of every workflow of ``job`` (payload data unencoded)."""
    ids = [workflow_id(job.id)] + [run.rollout_id for run in job.runs]
    raw = b""
    for wid in ids:
        history = await client.get_workflow_handle(wid).fetch_history()
        raw += b"".join(event.SerializeToString() for event in history.events)
    return raw
