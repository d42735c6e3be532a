"""Validate an exported line against the published ATIF schema of its version.

``atif_schemas/atif-v<version>.schema.json`` holds the JSON Schema made from the pydantic models
Harbor publishes (see the ``$comment`` in each file and ``atif_schemas/regenerate.py``). The few
rules of those models that JSON Schema cannot state are checked here: step ids sequential from 1,
every observation ``source_call_id`` naming a tool call of the same step (and, from v1.7, no
duplicate tool call ids in a step), and timestamps parsing as ISO 8601.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent / "atif_schemas"


@cache
def validator(version: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"atif-v{version}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check_rules(trajectory: dict[str, Any], version: str) -> None:
    """The models' cross-field validators; AssertionError naming the first broken one."""
    for i, step in enumerate(trajectory["steps"]):
        assert step["step_id"] == i + 1, f"steps[{i}].step_id is {step['step_id']}, not {i + 1}"
        if "timestamp" in step:
            try:
                datetime.fromisoformat(step["timestamp"])  # 3.11+: accepts a trailing Z
            except ValueError as exc:
                raise AssertionError(f"step {step['step_id']}: timestamp is not ISO 8601: {exc}") from exc
        ids = [c["tool_call_id"] for c in step.get("tool_calls") or []]
        if version != "1.4":
            assert len(ids) == len(set(ids)), f"step {step['step_id']}: duplicate tool_call_id in {ids}"
        for result in (step.get("observation") or {}).get("results", []):
            if result.get("source_call_id") is not None:
                assert result["source_call_id"] in ids, (
                    f"step {step['step_id']}: source_call_id {result['source_call_id']!r} not in {ids}")
    for sub in trajectory.get("subagent_trajectories") or []:
        check_rules(sub, version)


def validate(trajectory: dict[str, Any], version: str) -> None:
    """Raise (``jsonschema.ValidationError`` or AssertionError) unless ``trajectory`` is a valid
    ATIF document of ``version`` (``1.8`` or ``1.4``)."""
    validator(version).validate(trajectory)
    check_rules(trajectory, version)


def is_valid(trajectory: dict[str, Any], version: str) -> bool:
    try:
        validate(trajectory, version)
    except (jsonschema.ValidationError, AssertionError):
        return False
    return True
