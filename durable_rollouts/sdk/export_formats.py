"""Export formats of a job's runs: ``jsonl`` (our record), ``openai`` (chat fine-tuning lines) and
``atif`` (Harbor's Agent Trajectory Interchange Format, one trajectory per line: ``atif`` and
``atif-1.8`` write ATIF-v1.8, ``atif-1.4`` writes ATIF-v1.4; see ``atif``).

Pure functions over finished ``Run`` objects, used by both ``Job.export`` and ``rollouts export``.
Every format follows the reward semantics: ``reward`` is null unless the run succeeded (the
best-effort grade stays under ``grade``), and a run of a dropped group says ``dropped: true``.
Every format carries the policy version the rollout was sampled with (``policy_version``, null
when none was published). Messages are rebuilt from the trace's steps: the task step (the
prompt), ``system`` steps, ``agent`` steps (assistant messages with ``tool_calls``; usage, logprobs
and token ids in ``step.extra`` as ``OpenAIChatAgent`` records them) and ``tool`` steps.
Imports the standard library and ``models`` only; no Temporal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ..errors import ConfigError
from ..models import AgentSpec
from .atif import ATIF_DEFAULT_VERSION, ATIF_VERSIONS, atif_record
from .export_common import ordered_steps, prompt_messages, run_fields, text

__all__ = ["FORMATS", "atif_record", "check_format", "jsonl_record", "openai_record", "records",
           "write_lines"]

FORMATS = ("jsonl", "openai", "atif", *(f"atif-{v}" for v in ATIF_VERSIONS))
"""Every ``format`` name: ``atif`` is the newest ATIF version, ``atif-<v>`` pins one."""


def check_format(format: str) -> str:
    """``format`` if we write it, else one ConfigError line naming what we do write."""
    if format in FORMATS:
        return format
    if format.startswith("atif"):
        raise ConfigError(f"export format {format!r}: ATIF versions written are "
                          f"{', '.join(ATIF_VERSIONS)} (atif = {ATIF_DEFAULT_VERSION}); "
                          f"use one of {', '.join(f for f in FORMATS if f.startswith('atif'))}")
    raise ConfigError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")


def jsonl_record(run: Any) -> dict[str, Any]:
    """Our own line: ids, task (id, env, args and the whole row), reward (null unless
    succeeded), grade, attempts, retries, trace."""
    task = run.task
    out = run_fields(run)
    out.update({
        "task_id": task.id if task is not None else None,
        "env": task.env if task is not None else None,
        "args": task.args if task is not None else None,
        # the whole row (source, runtime_config, verifier): a re-grade from this file needs it
        "task": task.model_dump(mode="json", exclude_none=True) if task is not None else None,
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
    out: dict[str, Any] = {"role": role, "content": text(message.get("content"))}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(c, n + i) for i, c in enumerate(message["tool_calls"])]
    if role == "tool":
        out["tool_call_id"] = str(message.get("tool_call_id") or "")
    return out


def chat_messages(run: Any) -> list[dict[str, Any]]:
    """The rollout as OpenAI chat messages (system/user/assistant/tool), in trace order."""
    messages: list[dict[str, Any]] = []
    for step in ordered_steps(run.trace.steps):
        raw = prompt_messages(step) if step.task_call is not None else step.messages
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
    return {"messages": chat_messages(run), "tools": tools, **run_fields(run)}


# -- writing -------------------------------------------------------------------------------------


def records(runs: Iterable[Any], format: str = "jsonl",
            agent: AgentSpec | None = None) -> Iterator[dict[str, Any]]:
    """The export lines of ``runs`` in ``format`` (one of ``FORMATS``).

    Raises:
        ConfigError: an unknown format or ATIF version (at once, before any line is built).
    """
    check_format(format)
    if format == "openai":
        return (openai_record(run) for run in runs)
    if format.startswith("atif"):
        version = format.partition("-")[2] or ATIF_DEFAULT_VERSION
        return (atif_record(run, agent, version) for run in runs)
    return (jsonl_record(run) for run in runs)


def write_lines(runs: Iterable[Any], fh: IO[str], format: str = "jsonl",
                agent: AgentSpec | None = None) -> int:
    """Write one JSON line per run to ``fh``; returns how many."""
    count = 0
    for record in records(runs, format, agent):
        fh.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        count += 1
    return count
