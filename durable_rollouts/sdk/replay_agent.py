"""``ReplayAgent``: the agent of a re-grade; it calls no model and re-plays a saved rollout.

A re-grade (``Taskset.replay``) runs every saved rollout again as a real ``Rollout`` with the
card's steps: provision, connect and start place the task in a fresh session, this agent puts the
saved trajectory back (its steps, final answer, status and stop reason: the agent's end state as
it was), and grade (and verify) let the environment grade that answer anew. It re-issues nothing
to the environment. The agent reaches workers as data, so its config is one claim check: the uri
of a :class:`ReplayManifest` in the trace store (``ROLLOUTS_STORAGE``), which names each saved
trace by uri too; workflow history never carries a saved trace. Imports models, agents, run and
the trace store only; never Temporal.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from pydantic import Field

from ..errors import ConfigError
from ..models import StrictModel
from ..stores.blobs import default_blobs
from ..stores.tracestore import TraceStore
from .agents import Agent
from .run import Run

__all__ = ["REPLAY_LINK", "ReplayAgent", "ReplayEntry", "ReplayManifest", "entry_key"]

REPLAY_LINK = "regrade"
"""The key of ``trace.extra`` that links a re-graded run to the rollout it re-played."""


def entry_key(slug: str, group_index: int) -> str:
    """How a manifest names the rollout that runs ``slug`` as member ``group_index``."""
    return f"{slug}#{group_index}"


class ReplayEntry(StrictModel):
    """One saved rollout to re-play: where its trace is, and what it was."""

    trace: str  # the saved trace's uri (a ``rollouts-storage:`` claim check)
    job_id: str
    rollout_id: str
    group_id: str
    group_index: int
    status: str
    reward: float | None = None
    grade_reward: float | None = None


class ReplayManifest(StrictModel):
    """The saved rollouts one re-grade batch re-plays, by :func:`entry_key`."""

    entries: dict[str, ReplayEntry] = Field(default_factory=dict)

    def store(self) -> str:
        """Put the manifest in the blob store (``ROLLOUTS_STORAGE``); returns its uri."""
        return default_blobs().put(self.model_dump_json().encode())


@functools.lru_cache(maxsize=16)
def _manifest(uri: str) -> ReplayManifest:
    # Blobs are content-addressed, so a uri always names the same manifest: cache it per worker.
    return ReplayManifest.model_validate_json(default_blobs().get(uri))


class ReplayAgent(Agent):
    """Re-plays the saved rollout of each run from ``manifest``; calls no model, runs no tool.

    The run's trace becomes the saved one (steps, answer, status, stop reason) plus
    ``trace.extra["regrade"]``: the saved rollout's ``job_id``, ``rollout_id``, ``group_id``,
    ``group_index``, ``status``, ``reward``, ``grade_reward``, and ``prompt_changed`` (the fresh
    session's prompt differs from the saved one).
    """

    manifest: str

    async def __call__(self, run: Run) -> None:
        entries = (await asyncio.to_thread(_manifest, self.manifest)).entries
        entry = entries.get(entry_key(run.slug, run.group_index))
        if entry is None:
            raise ConfigError(f"the re-grade manifest names no saved rollout for {run.slug} "
                              f"member {run.group_index}")
        saved = await asyncio.to_thread(TraceStore().get, entry.trace)
        trace = run.trace
        trace.steps[:] = [step.model_copy(deep=True) for step in saved.steps]
        trace.content = saved.content
        trace.stop_reason = saved.stop_reason
        if saved.status != "running":
            trace.status = saved.status
        trace.extra = {**saved.extra, REPLAY_LINK: _link(entry, run, saved.steps)}


def _link(entry: ReplayEntry, run: Run, steps: list[Any]) -> dict[str, Any]:
    call = steps[0].task_call if steps else None
    saved_prompt = call.result if call is not None and call.phase == "setup" else None
    link = entry.model_dump(exclude={"trace"})
    link["prompt_changed"] = saved_prompt is not None and saved_prompt != run.prompt
    return link
