"""What every export format shares: a run's ids and outcome, message text, and the order of a
trace's steps. Imports the standard library and ``models`` only; no Temporal.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..models import Step

__all__ = ["ordered_steps", "policy_fields", "prompt_messages", "run_fields", "text"]


def text(content: Any) -> str:
    """A message's content as text: a string, the text blocks of a list, or JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: keep the text ones
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return json.dumps(content, default=str, ensure_ascii=False)


def _without_credentials(url: str) -> str:
    """``url`` minus any ``user:password@`` part and query string (a token never leaves)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def policy_fields(run: Any) -> dict[str, Any]:
    """The policy a rollout was sampled with: ``policy_version`` and ``policy_endpoint`` (None
    when the job never published one; read with ``getattr`` so older runs export too)."""
    endpoint = getattr(run, "policy_endpoint", None)
    if isinstance(endpoint, str):
        endpoint = _without_credentials(endpoint)
    return {"policy_version": getattr(run, "policy_version", None), "policy_endpoint": endpoint}


def run_fields(run: Any) -> dict[str, Any]:
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
        **policy_fields(run),
    }


def prompt_messages(step: Step) -> list[dict[str, Any]]:
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


def ordered_steps(steps: list[Step]) -> list[Step]:
    """Trace order, except that system prompts recorded before the first agent turn (the agent
    records its system prompt after the task step recorded the user prompt) come first."""
    first_agent = next((i for i, s in enumerate(steps) if s.source == "agent"), len(steps))
    head = steps[:first_agent]
    moved = {id(s) for s in head if s.source == "system" and s.messages}
    return ([s for s in head if id(s) in moved] + [s for s in head if id(s) not in moved]
            + steps[first_agent:])
