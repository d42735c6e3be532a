"""The seeds' module paths: ``hud.X`` -> ``durable_rollouts.X`` for environment, capabilities,
eval and agents, holding the names the seeds import (lazily: importing one loads nothing heavy)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS_IMPORT = {  # every `from hud.X import ...` in the seeds that names something we have
    "environment": {"Environment", "Workspace", "Mount", "Answer", "Capability"},
    "capabilities": {"Capability"},
    "eval": {"Job", "RuntimeConfig", "RuntimeResources", "RuntimeGPU", "RuntimeLimits", "Taskset",
             "Task", "Run", "Runtime", "LocalRuntime", "rollout"},
    "agents": {"Agent"},
}


@pytest.mark.parametrize("name", sorted(SEEDS_IMPORT))
def test_each_seed_module_path_holds_the_names_the_seeds_import(name: str) -> None:
    module = importlib.import_module(f"durable_rollouts.{name}")
    assert module.__all__ == sorted(module.__all__)
    assert SEEDS_IMPORT[name] <= set(module.__all__)
    for attr in module.__all__:
        value = getattr(module, attr)
        assert value is not None and attr in dir(module)
    with pytest.raises(AttributeError, match="has no attribute 'create_agent'"):
        module.create_agent  # noqa: B018


def test_they_are_the_package_s_own_objects() -> None:
    import durable_rollouts
    from durable_rollouts.capabilities import Capability
    from durable_rollouts.environment import Environment
    from durable_rollouts.eval import Taskset, rollout

    assert Environment is durable_rollouts.Environment and Capability is durable_rollouts.Capability
    assert Taskset is durable_rollouts.Taskset and rollout is durable_rollouts.rollout


def test_importing_them_loads_no_temporal_and_no_env_server() -> None:
    code = ("import sys\n"
            "import durable_rollouts.environment, durable_rollouts.capabilities, "
            "durable_rollouts.eval, durable_rollouts.agents\n"
            "print(sorted(m for m in sys.modules if m.startswith(('temporalio', "
            "'durable_rollouts.envserver', 'durable_rollouts.sdk'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
