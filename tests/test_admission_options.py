"""The admission options every runtime takes: checked once, at the boundary (no Temporal here).

The fleet-wide behaviour (three workers, the rate read back from history, the ceiling from the
provider) is tests/temporal/test_admission.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts.admission import Admission
from durable_rollouts.cli.specs import admit_runtime
from durable_rollouts.errors import ConfigError
from durable_rollouts.runtimes import Runtime, SubprocessRuntime
from durable_rollouts.workflows.plan import build_plan
from durable_rollouts.workflows.types import RolloutInput

ENV_FILE = str(Path(__file__).resolve().parents[1] / "examples" / "letters" / "env.py")
def test_admission_options_are_checked_and_need_a_runtime_that_places_substrates() -> None:
    """Bad values are one clear ConfigError; a borrowed server takes no admission options."""
    runtime = SubprocessRuntime(ENV_FILE, max_provisions_per_s=0.5, max_substrates=3)
    assert runtime.admission is not None
    assert (runtime.admission.burst, runtime.admission.window_s) == (1, 2.0)
    assert SubprocessRuntime(ENV_FILE).admission is None
    for bad in ({"max_provisions_per_s": 0}, {"max_provisions_per_s": -1.0},
                {"max_substrates": 0}, {"max_substrates": 2.5}, {"max_substrates": True}):
        with pytest.raises(ConfigError, match="max_"):
            SubprocessRuntime(ENV_FILE, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tcp://"):
        admit_runtime(Runtime("tcp://127.0.0.1:1"), 2, None)
    admit_runtime(runtime, None, 7)
    assert runtime.admission == runtime.admission.model_validate({"max_substrates": 7})


def test_an_admitted_rollout_provisions_as_a_regular_activity() -> None:
    """Under admission a fast local substrate still provisions as a regular activity (its start
    time is in history, where the rate is held); teardown stays local; without it nothing changes."""
    from durable_rollouts.models import AgentSpec, ProviderSpec, Task

    base = RolloutInput(rollout_id="r", job_id="j", group_id="g", group_index=0, row_index=0,
                        task=Task(env="letters", id="count_letter"), agent=AgentSpec(path="m:A"),
                        provider=ProviderSpec(kind="subprocess"), local_steps=True)
    plain = build_plan(base)
    admitted = build_plan(base.model_copy(update={"admission": Admission(max_substrates=2)}))
    assert (plain["provision"].local, plain.teardown.local) == (True, True)
    assert (admitted["provision"].local, admitted.teardown.local) == (False, True)
