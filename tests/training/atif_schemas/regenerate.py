"""Rebuild ``atif-v1.4.schema.json`` / ``atif-v1.8.schema.json`` from Harbor's published models.

Harbor publishes ATIF as pydantic models (``harbor/models/trajectories`` in the ``harbor`` wheel on
PyPI), not as a JSON Schema file. This script turns one unpacked wheel into a JSON Schema:
``Trajectory.model_json_schema()``, keeping only the validation keywords (no titles, descriptions or
defaults), plus each field-level ``model_validator`` JSON Schema can state (agent-only step fields,
``llm_call_count == 0``, content-part kinds, resolvable subagent refs) under ``allOf``. What JSON
Schema cannot state (sequential step ids, observation ``source_call_id`` -> the step's tool call
ids, ISO 8601 timestamps) is checked by ``atif_rules.check_rules``.

    pip download --no-deps --only-binary=:all: --python-version 3.12 harbor==0.26.0 -d /tmp/h
    python -m zipfile -e /tmp/h/harbor-0.26.0-py3-none-any.whl /tmp/h/x
    python tests/training/atif_schemas/regenerate.py /tmp/h/x 0.26.0 1.8
(and ``harbor==0.1.22 ... 1.4`` for v1.4, the last release whose models default to ATIF-v1.4).
Not run by the tests; kept so the next ATIF version is one command.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

KEEP = {"$defs", "$ref", "additionalProperties", "anyOf", "const", "enum", "items", "maxLength",
        "maximum", "minItems", "minLength", "minimum", "properties", "required", "type"}
AGENT_ONLY = ["model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"]
NULL = {"type": "null"}


def _structure(node: Any) -> Any:
    if isinstance(node, list):
        return [_structure(x) for x in node]
    if not isinstance(node, dict):
        return node
    return {k: (_structure(v) if k not in ("properties", "$defs") else
                {name: _structure(sub) for name, sub in v.items()})
            for k, v in node.items() if k in KEEP}


def _rules(defs: dict[str, Any]) -> None:
    """The pydantic ``model_validator``s of the models, as JSON Schema ``allOf`` entries."""
    step = defs["Step"].setdefault("allOf", [])
    step.append({"$comment": "Step.validate_agent_only_fields",
                 "if": {"properties": {"source": {"not": {"const": "agent"}}}},
                 "then": {"properties": {f: NULL for f in AGENT_ONLY}}})
    if "llm_call_count" in defs["Step"]["properties"]:
        step.append({"$comment": "Step.validate_llm_call_count_zero_fields",
                     "if": {"required": ["source", "llm_call_count"],
                            "properties": {"source": {"const": "agent"}, "llm_call_count": {"const": 0}}},
                     "then": {"properties": {"metrics": NULL, "reasoning_content": NULL}}})
    if "ContentPart" in defs:
        kinds = {"image": "ImageSource", "audio": "AudioSource"}
        defs["ContentPart"]["allOf"] = [
            {"$comment": "ContentPart.validate_content_type: text parts",
             "if": {"properties": {"type": {"const": "text"}}},
             "then": {"required": ["text"], "properties": {"text": {"type": "string"}, "source": NULL}}},
            *({"$comment": f"ContentPart.validate_content_type: {kind} parts",
               "if": {"properties": {"type": {"const": kind}}},
               "then": {"required": ["source"],
                        "properties": {"text": NULL, "source": {"$ref": f"#/$defs/{ref}"}}}}
              for kind, ref in kinds.items() if ref in defs)]
    ref = defs["SubagentTrajectoryRef"]
    if "trajectory_id" in ref["properties"]:
        ref["allOf"] = [{"$comment": "SubagentTrajectoryRef.validate_is_resolvable",
                         "anyOf": [{"required": [key], "properties": {key: {"type": "string"}}}
                                   for key in ("trajectory_id", "trajectory_path")]}]


def build(wheel_root: Path, harbor_version: str, atif_version: str) -> dict[str, Any]:
    for name, sub in (("harbor", "harbor"), ("harbor.models", "harbor/models")):
        module = types.ModuleType(name)  # namespace stubs: only the models package is imported
        module.__path__ = [str(wheel_root / sub)]
        sys.modules[name] = module
    models = importlib.import_module("harbor.models.trajectories.trajectory")
    raw = models.Trajectory.model_json_schema()
    body = _structure(raw)
    defs = body.setdefault("$defs", {})
    if "$ref" not in body:  # a non-recursive root: name it like the recursive one does
        defs["Trajectory"] = {k: v for k, v in body.items() if k != "$defs"}
        body = {"$defs": defs, "$ref": "#/$defs/Trajectory"}
    _rules(defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:durable-rollouts:test-data:atif-v{atif_version}",
        "$comment": (f"ATIF-v{atif_version} (Harbor's Agent Trajectory Interchange Format, RFC 0001). "
                     f"Generated from the pydantic models Harbor publishes in the harbor {harbor_version} "
                     "wheel (harbor/models/trajectories; Apache-2.0; github.com/harbor-framework/harbor) "
                     "by tests/training/atif_schemas/regenerate.py: validation keywords only, plus the "
                     "models' field-level validators under allOf. Cross-field rules are checked by "
                     "tests/training/atif_rules.py. Test data, not code."),
        **body,
    }


if __name__ == "__main__":
    root, harbor_version, atif_version = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    out = Path(__file__).with_name(f"atif-v{atif_version}.schema.json")
    out.write_text(json.dumps(build(root, harbor_version, atif_version), indent=1) + "\n")
    print(out)
