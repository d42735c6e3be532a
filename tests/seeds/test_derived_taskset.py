"""Seed 003's deriving replay taskset: ``record_anchors`` and ``build_prompt`` derive new tasks
from saved rollouts lazily (once per group), each carrying its lineage; derived rollouts are not
derived again unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts import Task, Taskset
from durable_rollouts.errors import ConfigError
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.derived import DerivedTaskset, lineage
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run
from durable_rollouts.sdk.saved_rollouts import SavedRollout

CHAT = Path(__file__).parent / "envs" / "chat.py"


class Talker(Agent):
    """Answers with the turn number it is on."""

    async def __call__(self, run: Run) -> None:
        run.trace.content = f"turn {len(run.task.args.get('history', [])) + 1} on {run.task.args['topic']}"


class Continue(DerivedTaskset):
    """Resumes each saved conversation after its answer; two anchors: the answer kept or redone."""

    built: list[str] = []

    def record_anchors(self, saved: SavedRollout) -> list[str]:
        return ["after", "redo"]

    def build_prompt(self, saved: SavedRollout, anchor: str) -> Task:
        Continue.built.append(saved.rollout_id)
        history = list(saved.task.args["history"])
        if anchor == "after":
            history.append(saved.answer)
        return saved.task.model_copy(update={"args": {**saved.task.args, "history": history}})


async def test_derived_tasks_are_built_per_group_and_carry_their_lineage() -> None:
    first = await run_direct(Taskset.from_file(CHAT), Talker(), group=2)
    Continue.built = []
    derived = Continue(first)
    assert len(derived) == 2 * 2 * 2 and not Continue.built  # 4 rollouts x 2 anchors, lazily
    second = await run_direct(derived.filter(lambda t: True), Talker(), group=3)
    assert len(Continue.built) == 8  # once per group, not per rollout
    assert {r.status for r in second.runs} == {"succeeded"}
    after = [r for r in second.runs if lineage(r.task)["anchor"] == "after"]
    assert {r.trace.content for r in after} == {"turn 2 on tea", "turn 2 on rain"}
    for run in second.runs:
        stamp = lineage(run.task)
        assert stamp["job_id"] == first.id and stamp["depth"] == 1
        assert stamp["rollout_id"] in {r.rollout_id for r in first.runs}
    groups = {}
    for run in second.runs:
        groups.setdefault(run.group_id, set()).add(run.task.model_dump_json())
    assert all(len(tasks) == 1 for tasks in groups.values())  # a group shares one derived task

    with pytest.raises(ConfigError, match="derived ones are skipped unless chain=True"):
        Continue(second)
    chained = Continue(second, chain=True)
    third = await run_direct(chained.filter(ids=["chat"]), Talker())
    assert {lineage(r.task)["depth"] for r in third.runs} == {2}


async def test_a_derived_taskset_reads_a_jsonl_export(tmp_path: Path) -> None:
    first = await run_direct(Taskset.from_file(CHAT), Talker())
    path = first.export(tmp_path / "first.jsonl", format="jsonl")
    derived = Continue(path, min_reward=1.0)
    job = await run_direct(derived, Talker())
    assert len(job.runs) == 4 and {lineage(r.task)["job_id"] for r in job.runs} == {first.id}
