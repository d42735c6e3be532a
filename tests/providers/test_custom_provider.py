"""A runtime the user registers by import path records the card's steps like the built-ins."""

from __future__ import annotations

from pathlib import Path

from custom_provider import CountingProvider
from durable_shape import CARD, durable_shapes
from temporal_helpers import ENV_FILE

from durable_rollouts.models import Task
from durable_rollouts.sdk.agents import FixedAgent


async def test_a_durable_rollout_on_a_registered_provider_records_the_card_steps(tmp_path: Path) -> None:
    log = tmp_path / "provider.log"
    task = Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "x"})
    job, shapes = await durable_shapes(CountingProvider(ENV_FILE, log=str(log)), [task],
                                       FixedAgent(answer="x"), tmp_path)
    assert [r.reward for r in job.runs] == [1.0], [r.error for r in job.runs]
    assert shapes == [CARD]
    key = job.runs[0].rollout_id
    assert log.read_text().splitlines() == [f"acquire {key}", f"release {key}"]
