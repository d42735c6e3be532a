"""HUD v6 task rows and agents on our side: ``task_from_hud`` and ``run_hud_agent``.

A ``hud.eval.Task`` (what calling a HUD template returns) becomes our :class:`Task` with every
field it carries (``slug``, ``validation``, ``agent_config``, ``columns`` ...) and ``source`` set to
the file that defines its template, so a provider can serve that file. A HUD agent (a subclass of
``hud.agents.base.Agent``) runs as a rollout's agent through ``agents.HudAgent``, which calls
:func:`run_hud_agent`: the agent gets a ``hud.eval.Run`` built from ours (prompt, bindings, a
``HudClient`` whose bindings point at our tunnels) and its trace and answer are copied back. hud
is imported lazily, only for HUD objects. Imports models and hud_detect; never Temporal,
envserver or the agents module (which imports this one).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from typing import TYPE_CHECKING, Any

from ..hud_detect import import_hud
from ..models import Step, Task

if TYPE_CHECKING:
    from .run import Run

__all__ = ["run_hud_agent", "task_from_hud"]

_SOURCES = frozenset({"user", "agent", "tool", "task", "subagent", "system"})


def task_from_hud(task: Any, default_source: str | None = None) -> Task:
    """Our row for a ``hud.eval.Task``, every field kept; ``source`` is the file of its template
    (``default_source`` when that cannot be found)."""
    data = task.model_dump(mode="json", exclude_none=True)
    return Task.model_validate({**data, "source": _template_file(task) or default_source})


def _template_file(task: Any) -> str | None:
    env = getattr(task, "_env", None)  # set by hud on rows minted by calling a template
    template = getattr(env, "tasks", {}).get(task.id) if env is not None else None
    func = getattr(template, "func", None)
    try:
        return inspect.getsourcefile(func) if func is not None else None
    except TypeError:
        return None


async def run_hud_agent(agent: Any, run: Run) -> None:
    """Let the HUD agent object ``agent`` work on our ``run``: it gets a ``hud.eval.Run`` built from
    ours, and its answer, status and steps are copied back (also when it raises)."""
    hud_run, client = await _hud_run(run)
    try:
        await agent(hud_run)
    finally:
        _copy_trace(hud_run.trace, run)
        await client.close()


async def _hud_run(run: Run) -> tuple[Any, Any]:
    """A ``hud.eval.Run`` for ``run``, and its client (closed by the caller).

    The client speaks for the session's capabilities only (``binding``/``open``/``manifest``,
    through our tunnels): the rollout owns the task's start and grade, so its control stream is a
    closed socket pair and any task call on it fails at once.
    """
    client_module = import_hud("hud.clients.client", "a HUD agent")
    capabilities = import_hud("hud.capabilities", "a HUD agent")
    run_module = import_hud("hud.eval.run", "a HUD agent")
    ours, theirs = socket.socketpair()
    theirs.close()
    reader, writer = await asyncio.open_connection(sock=ours)
    client = client_module.HudClient(reader, writer)
    env_name, env_version, session_id = "", "", ""
    if run.client is not None:
        env_name = run.client.env.name if run.client.env else ""
        env_version = run.client.env.version if run.client.env else ""
        session_id = run.client.session_id or ""
    bindings = [run.binding(b["name"]) for b in run.bindings if b.get("name")]
    client.manifest = client_module.Manifest(
        session_id=session_id, protocol_version=client_module.HudClient.PROTOCOL_VERSION,
        server_info=client_module.ServerInfo(name=env_name, version=env_version),
        bindings=[capabilities.Capability.from_manifest(b) for b in bindings],
    )
    task_id, args = (run.task.id, dict(run.task.args)) if run.task is not None else ("", {})
    hud_run = run_module.Run(client, task_id, args)
    frame = run.prompt if isinstance(run.prompt, dict) else {"prompt": run.prompt}
    hud_run.prompt = frame.get("prompt")
    episode = frame.get("bindings")
    hud_run.bindings = episode if isinstance(episode, dict) else {}
    hud_run.job_id, hud_run.group_id, hud_run.slug = run.job_id, run.group_id, run.slug
    hud_run.trace.trace_id = run.rollout_id or None
    return hud_run, client


def _copy_trace(trace: Any, run: Run) -> None:
    """Our trace gets the HUD trace's answer, status and steps (each kept whole in ``extra``)."""
    run.trace.content = trace.content
    for step in trace.steps:
        dumped = step.model_dump(mode="json")
        messages = [m for m in dumped.get("messages") or [] if isinstance(m, dict)]
        source = step.source if step.source in _SOURCES else "agent"  # e.g. a robot observation
        run.trace.record(Step(source=source, messages=messages, error=step.error,
                              ended_at=time.time(), extra={"hud": dumped}))
    if trace.stop_reason is not None:
        run.trace.stop_reason = trace.stop_reason
    if trace.status == "error":
        run.trace.status = "error"
