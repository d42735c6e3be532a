"""A finished run as one ATIF trajectory (Harbor's Agent Trajectory Interchange Format, RFC 0001).

Two versions are written: ``ATIF-v1.8`` (the current one, the default) and ``ATIF-v1.4`` (for
readers that predate 1.5). What differs between them here: 1.8 has ``trajectory_id``,
``agent.tool_definitions``, ``llm_call_count`` on steps and ``extra`` on observation results; 1.4
keeps the offered tools under ``agent.extra`` and tool errors under the step's ``extra``.

Mapping of a trace: system prompts and the task prompt are ``system`` / ``user`` steps; each
``agent`` step is one model reply (message, ``tool_calls`` with parsed arguments, ``metrics``:
token counts, cached tokens, logprobs, prompt and completion token ids as ``OpenAIChatAgent``
records them); each ``tool`` step is an observation result of the agent step that called it. Our
ids, reward (null unless the run succeeded), grade and policy version go under the root ``extra``.
Imports the standard library and ``models`` only; no Temporal.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigError
from ..models import AgentSpec, Step
from .export_common import ordered_steps, prompt_messages, run_fields, text

__all__ = ["ATIF_DEFAULT_VERSION", "ATIF_VERSIONS", "atif_record", "schema_version"]

ATIF_VERSIONS = ("1.8", "1.4")
"""The ATIF versions we write, newest first."""
ATIF_DEFAULT_VERSION = "1.8"
_VERSION = "0.1.0"  # durable-rollouts, named as the agent system's version when none is known


def schema_version(version: str) -> str:
    """``1.8`` -> ``ATIF-v1.8``, the root ``schema_version`` of that version."""
    return f"ATIF-v{version}"


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _ints(raw: Any) -> list[int] | None:
    """A list of token ids, or None when ``raw`` is not one (a bool is not a token id)."""
    if isinstance(raw, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return raw
    return None


def _logprobs(raw: Any) -> list[float] | None:
    """Per-token log probabilities from an OpenAI ``logprobs`` object (or a plain list)."""
    items = raw.get("content") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        value = item.get("logprob") if isinstance(item, dict) else item
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
    return out or None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _metrics(extra: dict[str, Any]) -> dict[str, Any]:
    """A reply's usage, logprobs and token ids as ATIF metrics (only what was recorded)."""
    usage = extra.get("usage") if isinstance(extra.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    metrics: dict[str, Any] = {
        "prompt_tokens": _count(usage.get("prompt_tokens")),
        "completion_tokens": _count(usage.get("completion_tokens")),
        "cached_tokens": _count(cached),
        "prompt_token_ids": _ints(extra.get("prompt_token_ids")),
        "completion_token_ids": _ints(extra.get("token_ids")),
        "logprobs": _logprobs(extra.get("logprobs")),
    }
    return {k: v for k, v in metrics.items() if v is not None}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"raw": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _agent_step(step: Step, step_id: int, version: str) -> dict[str, Any]:
    message = step.messages[0] if step.messages else {}
    out: dict[str, Any] = {"step_id": step_id, "timestamp": _iso(step.started_at),
                           "source": "agent", "message": text(message.get("content"))}
    if isinstance(step.extra.get("model"), str):
        out["model_name"] = step.extra["model"]
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {"tool_call_id": str(c.get("id") or f"call_{step_id}_{i}"),
             "function_name": str((c.get("function") or {}).get("name") or ""),
             "arguments": _arguments((c.get("function") or {}).get("arguments"))}
            for i, c in enumerate(calls)]
    metrics = _metrics(step.extra)
    if metrics:
        out["metrics"] = metrics
    if version != "1.4" and isinstance(step.extra.get("usage"), dict):
        out["llm_call_count"] = 1  # a recorded usage means one model reply
    if isinstance(step.extra.get("finish_reason"), str):
        out["extra"] = {"finish_reason": step.extra["finish_reason"]}
    return out


def _other_step(step: Step, step_id: int) -> dict[str, Any]:
    source = "user" if step.source == "user" or step.task_call is not None else "system"
    messages = prompt_messages(step) if step.task_call is not None else step.messages
    message = "\n".join(text(m.get("content")) for m in messages if isinstance(m, dict))
    out: dict[str, Any] = {"step_id": step_id, "timestamp": _iso(step.started_at), "source": source,
                           "message": message or (step.error or "")}
    extra: dict[str, Any] = {}
    if step.source not in ("user", "system"):
        extra["trace_source"] = step.source  # task / subagent
    if step.error:
        extra["error"] = step.error
    if step.extra.get("repair"):
        extra["repair"] = True
    if extra:
        out["extra"] = extra
    return out


def _observe(steps: list[dict[str, Any]], step: Step, version: str) -> None:
    """Put a tool result on the agent step that called it (or, failing that, on a system step:
    ATIF lets system steps carry observations, and ``source_call_id`` must name a call of the
    same step)."""
    message = step.messages[0] if step.messages else {}
    call_id = str(message.get("tool_call_id") or "")
    result: dict[str, Any] = {"content": text(message.get("content"))}
    owner = steps[-1] if steps and steps[-1]["source"] == "agent" else None
    if owner is not None and any(c["tool_call_id"] == call_id for c in owner.get("tool_calls", [])):
        result = {"source_call_id": call_id, **result}
    else:
        owner = {"step_id": len(steps) + 1, "timestamp": _iso(step.started_at), "source": "system",
                 "message": "", "extra": {"trace_source": "tool", "tool_call_id": call_id}}
        steps.append(owner)
    if step.error:
        if version == "1.4":  # no extra on an observation result before 1.7
            owner.setdefault("extra", {}).setdefault("tool_errors", {})[call_id] = step.error
        else:
            result["extra"] = {"error": step.error}
    owner.setdefault("observation", {"results": []})["results"].append(result)


def _steps(run: Any, version: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for step in ordered_steps(run.trace.steps):
        if step.source == "tool":
            _observe(steps, step, version)
        elif step.source == "agent":
            steps.append(_agent_step(step, len(steps) + 1, version))
        else:
            steps.append(_other_step(step, len(steps) + 1))
    if not any(s["source"] == "agent" for s in steps) and run.trace.content is not None:
        last = run.trace.steps[-1].ended_at if run.trace.steps else None
        steps.append({"step_id": len(steps) + 1, "timestamp": _iso(last), "source": "agent",
                      "message": run.trace.content})
    if not steps:  # ATIF wants at least one step: say what there is (the prompt)
        steps.append({"step_id": 1, "source": "user", "message": run.prompt_text})
    for s in steps:
        if s.get("timestamp") is None:
            s.pop("timestamp", None)
    return steps


def _agent(run: Any, agent: AgentSpec | None, steps: list[dict[str, Any]],
           version: str) -> dict[str, Any]:
    config = agent.config if agent is not None else {}
    models = [s["model_name"] for s in steps if "model_name" in s]
    model_name = config.get("model") if isinstance(config.get("model"), str) else None
    out: dict[str, Any] = {"name": agent.path if agent is not None else "unknown",
                           "version": str(config.get("version") or _VERSION)}
    if model_name or models:
        out["model_name"] = model_name or models[0]
    tools = run.trace.extra.get("tools")
    if isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools):
        if version == "1.4":  # tool_definitions arrived in 1.5
            out["extra"] = {"tool_definitions": tools}
        else:
            out["tool_definitions"] = tools
    return out


def _final_metrics(steps: list[dict[str, Any]]) -> dict[str, Any]:
    metrics = [s["metrics"] for s in steps if "metrics" in s]
    out = {"total_prompt_tokens": sum(m.get("prompt_tokens", 0) for m in metrics),
           "total_completion_tokens": sum(m.get("completion_tokens", 0) for m in metrics)}
    if any("cached_tokens" in m for m in metrics):
        out["total_cached_tokens"] = sum(m.get("cached_tokens", 0) for m in metrics)
    out["total_steps"] = len(steps)
    return out


def atif_record(run: Any, agent: AgentSpec | None = None,
                version: str = ATIF_DEFAULT_VERSION) -> dict[str, Any]:
    """One ATIF trajectory of ``run`` in ``version`` (``1.8`` or ``1.4``): ``session_id`` is the
    rollout id; in 1.8 ``trajectory_id`` names the attempt (the Rollout workflow) that made it."""
    if version not in ATIF_VERSIONS:
        raise ConfigError(f"ATIF version {version!r}: use one of {', '.join(ATIF_VERSIONS)}")
    steps = _steps(run, version)
    extra = run_fields(run)
    extra.update(grade=run.grade.model_dump(mode="json") if run.grade is not None else None,
                 error=run.error, error_phase=run.error_phase, attempt=run.attempt,
                 retries=run.retries, stop_reason=run.trace.stop_reason)
    record: dict[str, Any] = {"schema_version": schema_version(version),
                              "session_id": run.rollout_id}
    if version != "1.4":
        retry = max(run.attempt - 1, 0)
        record["trajectory_id"] = run.rollout_id if retry == 0 else f"{run.rollout_id}-r{retry}"
    record.update(agent=_agent(run, agent, steps, version), steps=steps,
                  final_metrics=_final_metrics(steps), extra=extra)
    return record
