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


def local_activity(event: Any) -> dict[str, Any] | None:
    """What a local activity's marker event records (its ``activity_type``, ``attempt``, ...);
    None for any other event, a patch marker included."""
    import json

    if not event.HasField("marker_recorded_event_attributes"):
        return None
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != "core_local_activity":
        return None
    return json.loads(marker.details["data"].payloads[0].data)  # type: ignore[no-any-return]


def step_events(history: Any) -> list[tuple[str, str]]:
    """The steps a workflow history records, in order: ``(activity type, kind)`` per step, where
    kind is ``local`` (a local activity's marker) or ``activity`` (a scheduled activity)."""
    out: list[tuple[str, str]] = []
    for event in history.events:
        if (data := local_activity(event)) is not None:
            out.append((data["activity_type"], "local"))
        elif event.HasField("activity_task_scheduled_event_attributes"):
            out.append((event.activity_task_scheduled_event_attributes.activity_type.name, "activity"))
    return out


def step_names(history: Any) -> list[str]:
    """The card's step names a history records, in order (``rollouts.`` prefix dropped)."""
    return [name.removeprefix("rollouts.") for name, _ in step_events(history)]
