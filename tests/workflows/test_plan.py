"""The Rollout's plan: the card's steps with their options, one table (``workflows.plan``)."""

from __future__ import annotations

from datetime import timedelta

from durable_rollouts.models import AgentSpec, ProviderSpec, Task
from durable_rollouts.workflows.plan import build_plan
from durable_rollouts.workflows.types import CARD_LAYOUT, RolloutInput

CARD = ["provision", "connect", "start", "agent", "grade", "teardown"]


def _input(task: Task | None = None, **extra: object) -> RolloutInput:
    return RolloutInput(rollout_id="r", job_id="j", group_id="g", group_index=0, row_index=0,
                        task=task or Task(env="stub", id="add"), agent=AgentSpec(path="stub"),
                        provider=ProviderSpec(kind="stub"), layout=CARD_LAYOUT, **extra)


def test_the_plan_lists_the_card_steps_and_the_agent_heartbeats() -> None:
    plan = build_plan(_input())
    assert plan.names == CARD
    assert plan["agent"].heartbeat == timedelta(seconds=20) and not plan["agent"].local
    assert all(plan[s].retry.maximum_attempts >= 3 for s in CARD)


def test_the_agent_heartbeat_timeout_comes_from_the_input() -> None:
    """``ROLLOUTS_AGENT_HEARTBEAT`` travels in the input (an activity option: replay-safe)."""
    assert build_plan(_input(agent_heartbeat_s=3.0))["agent"].heartbeat == timedelta(seconds=3)


def test_a_verifier_adds_its_three_steps_before_teardown() -> None:
    task = Task(env="stub", id="add", verifier=Task(env="stub", id="check"))
    assert build_plan(_input(task=task)).names == CARD[:5] + ["verify_open", "verify", "verify_close",
                                                              "teardown"]


def test_a_fast_runtime_provisions_and_tears_down_locally() -> None:
    fast, remote = build_plan(_input(local_steps=True)), build_plan(_input(local_steps=False))
    assert fast["provision"].local and fast["teardown"].local
    assert not remote["provision"].local and not remote["teardown"].local
    assert remote["connect"].local and remote["grade"].local  # when the substrate is reachable


def test_the_agent_step_outlasts_the_rollout_timeout_by_a_minute() -> None:
    assert build_plan(_input(rollout_timeout_s=30))["agent"].start_to_close == timedelta(seconds=90)
    assert build_plan(_input())["agent"].start_to_close == timedelta(hours=24)
