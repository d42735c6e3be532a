"""Export formats of a job's runs: ``jsonl`` (our record), ``openai`` (chat fine-tuning lines) and
``atif`` (Harbor's Agent Trajectory Interchange Format, one trajectory per line).

Pure functions over finished ``Run`` objects, used by both ``Job.export`` and ``rollouts export``.
Every format follows the reward semantics: ``reward`` is null unless the run succeeded (the
best-effort grade stays under ``grade``), and a run of a dropped group says ``dropped: true``.
Messages are rebuilt from the trace's steps: the task step (the prompt), ``system`` steps,
``agent`` steps (assistant messages with ``tool_calls``; usage, logprobs and token ids in
``step.extra`` as ``OpenAIChatAgent`` records them) and ``tool`` steps (``tool`` messages).
Imports the standard library and ``models`` only; no Temporal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from ..errors import ConfigError
from ..models import AgentSpec, Step

__all__ = ["ATIF_SCHEMA_VERSION", "FORMATS", "atif_record", "jsonl_record", "openai_record",
           "records", "write_lines"]

FORMATS = ("jsonl", "openai", "atif")
ATIF_SCHEMA_VERSION = "ATIF-v1.4"
"""The ATIF RFC version whose fields we write (v1.4 adds ``prompt_token_ids`` to metrics)."""
_VERSION = "0.1.0"  # durable-rollouts, named as the agent system's version when none is known


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: keep the text ones
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return json.dumps(content, default=str, ensure_ascii=False)


def _base(run: Any) -> dict[str, Any]:
    """Ids, outcome and policy fields every format carries next to its own shape."""
    return {
        "job_id": run.job_id,
        "rollout_id": run.rollout_id,
        "slug": run.slug,
        "group_id": run.group_id,
        "group_index": run.group_index,
        "status": run.status,
        "reward": run.reward,
        "dropped": run.dropped,
    }


def jsonl_record(run: Any) -> dict[str, Any]:
    """Our own line: ids, task, reward (null unless succeeded), grade, attempts, retries, trace."""
    task = run.task
    out = _base(run)
    out.update({
        "task_id": task.id if task is not None else None,
        "env": task.env if task is not None else None,
        "args": task.args if task is not None else None,
        "grade": run.grade.model_dump(mode="json") if run.grade is not None else None,
        "attempts": run.attempts,
        "retries": run.retries,
        "retry_history": [r.model_dump(mode="json") for r in run.retry_history],
        "error": run.error,
        "error_phase": run.error_phase,
        "prompt": run.prompt,
        "answer": run.trace.content,
        "trace": run.trace.model_dump(mode="json"),
    })
    return out


# -- openai --------------------------------------------------------------------------------------


def _tool_call(call: dict[str, Any], n: int) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # fine-tuning wants the arguments as a JSON string
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": str(call.get("id") or f"call_{n}"), "type": "function",
            "function": {"name": str(function.get("name") or ""), "arguments": arguments}}


def _chat_message(message: dict[str, Any], n: int) -> dict[str, Any] | None:
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        return None
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(c, n + i) for i, c in enumerate(message["tool_calls"])]
    if role == "tool":
        out["tool_call_id"] = str(message.get("tool_call_id") or "")
    return out


def _prompt_messages(step: Step) -> list[dict[str, Any]]:
    """The task step's prompt: a string, or a list of chat messages."""
    out = []
    for message in step.messages:
        content = message.get("content")
        if isinstance(content, list) and content and all(
                isinstance(m, dict) and "role" in m for m in content):
            out.extend(content)  # a messages prompt
        else:
            out.append(message)
    return out


def _ordered(steps: list[Step]) -> list[Step]:
    """Trace order, except that system prompts recorded before the first agent turn (the agent
    records its system prompt after the task step recorded the user prompt) come first."""
    first_agent = next((i for i, s in enumerate(steps) if s.source == "agent"), len(steps))
    head = steps[:first_agent]
    moved = {id(s) for s in head if s.source == "system" and s.messages}
    return ([s for s in head if id(s) in moved] + [s for s in head if id(s) not in moved]
            + steps[first_agent:])


def chat_messages(run: Any) -> list[dict[str, Any]]:
    """The rollout as OpenAI chat messages (system/user/assistant/tool), in trace order."""
    messages: list[dict[str, Any]] = []
    for step in _ordered(run.trace.steps):
        raw = _prompt_messages(step) if step.task_call is not None else step.messages
        for message in raw:
            converted = _chat_message(message, len(messages))
            if converted is not None:
                messages.append(converted)
    if not any(m["role"] == "user" for m in messages):
        messages.insert(next((i + 1 for i, m in enumerate(messages) if m["role"] == "system"), 0),
                        {"role": "user", "content": run.prompt_text})
    if not any(m["role"] == "assistant" for m in messages) and run.trace.content is not None:
        messages.append({"role": "assistant", "content": run.trace.content})  # a tool-less agent
    return messages


def openai_record(run: Any) -> dict[str, Any]:
    """One chat fine-tuning line: ``messages`` and ``tools``, plus reward, group id and status."""
    tools = run.trace.extra.get("tools") if isinstance(run.trace.extra.get("tools"), list) else []
    return {"messages": chat_messages(run), "tools": tools, **_base(run)}


# -- atif ----------------------------------------------------------------------------------------


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


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


def _metrics(extra: dict[str, Any]) -> dict[str, Any] | None:
    usage = extra.get("usage") if isinstance(extra.get("usage"), dict) else {}
    metrics: dict[str, Any] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        if isinstance(usage.get(key), int):
            metrics[key] = usage[key]
    logprobs = _logprobs(extra.get("logprobs"))
    if logprobs is not None:
        metrics["logprobs"] = logprobs
    if isinstance(extra.get("token_ids"), list):
        metrics["completion_token_ids"] = extra["token_ids"]
    if isinstance(extra.get("prompt_token_ids"), list):
        metrics["prompt_token_ids"] = extra["prompt_token_ids"]
    return metrics or None


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"raw": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _atif_step(step: Step, step_id: int) -> dict[str, Any]:
    out: dict[str, Any] = {"step_id": step_id, "timestamp": _iso(step.started_at)}
    if step.source == "agent":
        message = step.messages[0] if step.messages else {}
        out.update(source="agent", message=_text(message.get("content")))
        if isinstance(step.extra.get("model"), str):
            out["model_name"] = step.extra["model"]
        calls = message.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [{"tool_call_id": str(c.get("id") or f"call_{step_id}_{i}"),
                                  "function_name": str((c.get("function") or {}).get("name") or ""),
                                  "arguments": _arguments((c.get("function") or {}).get("arguments"))}
                                 for i, c in enumerate(calls)]
        metrics = _metrics(step.extra)
        if metrics:
            out["metrics"] = metrics
        return out
    source = "user" if step.source == "user" or step.task_call is not None else "system"
    text = "\n".join(_text(m.get("content")) for m in step.messages) if step.messages else ""
    out.update(source=source, message=text or (step.error or ""))
    if step.error:
        out["extra"] = {"error": step.error}
    return out


def atif_record(run: Any, agent: AgentSpec | None = None) -> dict[str, Any]:
    """One ATIF trajectory (``schema_version`` ATIF-v1.4); our ids and outcome under ``extra``."""
    steps: list[dict[str, Any]] = []
    for step in _ordered(run.trace.steps):
        if step.source == "tool":  # a tool result: the observation of the agent step that called it
            message = step.messages[0] if step.messages else {}
            result = {"source_call_id": str(message.get("tool_call_id") or ""),
                      "content": _text(message.get("content"))}
            owner = steps[-1] if steps and steps[-1]["source"] == "agent" else None
            if owner is None:
                owner = {"step_id": len(steps) + 1, "timestamp": _iso(step.started_at),
                         "source": "system", "message": ""}
                steps.append(owner)
            owner.setdefault("observation", {"results": []})["results"].append(result)
            continue
        steps.append(_atif_step(step, len(steps) + 1))
    if not any(s["source"] == "agent" for s in steps) and run.trace.content is not None:
        steps.append({"step_id": len(steps) + 1, "timestamp": _iso(run.trace.steps[-1].ended_at
                                                                   if run.trace.steps else None),
                      "source": "agent", "message": run.trace.content})
    for s in steps:
        if s.get("timestamp") is None:
            s.pop("timestamp", None)
    models = [s["model_name"] for s in steps if "model_name" in s]
    config = agent.config if agent is not None else {}
    model_name = config.get("model") if isinstance(config.get("model"), str) else None
    model_name = model_name or (models[0] if models else None)
    agent_obj: dict[str, Any] = {"name": agent.path if agent is not None else "unknown",
                                 "version": str(config.get("version") or _VERSION)}
    if model_name:
        agent_obj["model_name"] = model_name
    prompt = [s["metrics"].get("prompt_tokens", 0) for s in steps if "metrics" in s]
    completion = [s["metrics"].get("completion_tokens", 0) for s in steps if "metrics" in s]
    base = _base(run)
    base["grade"] = run.grade.model_dump(mode="json") if run.grade is not None else None
    base["error"], base["error_phase"], base["retries"] = run.error, run.error_phase, run.retries
    return {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": run.rollout_id,
        "agent": agent_obj,
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": sum(prompt), "total_completion_tokens": sum(completion),
                          "total_steps": len(steps)},
        "extra": base,
    }


# -- writing -------------------------------------------------------------------------------------


def records(runs: Iterable[Any], format: str = "jsonl",
            agent: AgentSpec | None = None) -> Iterator[dict[str, Any]]:
    """The export lines of ``runs`` in ``format`` (``jsonl``, ``openai`` or ``atif``).

    Raises:
        ConfigError: an unknown format (at once, before any line is built).
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
    if format == "openai":
        return (openai_record(run) for run in runs)
    if format == "atif":
        return (atif_record(run, agent) for run in runs)
    return (jsonl_record(run) for run in runs)


def write_lines(runs: Iterable[Any], fh: IO[str], format: str = "jsonl",
                agent: AgentSpec | None = None) -> int:
    """Write one JSON line per run to ``fh``; returns how many."""
    count = 0
    for record in records(runs, format, agent):
        fh.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        count += 1
    return count
