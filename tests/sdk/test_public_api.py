"""The public import surface: names, sorted ``__all__``, and an import with no side effects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import durable_rollouts
import durable_rollouts.graders
import durable_rollouts.runtimes
import durable_rollouts.sdk

REPO = Path(__file__).resolve().parents[2]


def test_design_names_are_exported_and_sorted() -> None:
    expected = {"Environment", "Answer", "Capability", "Task", "Taskset", "Job", "Run", "Agent",
                "Runtime", "LocalRuntime", "SubprocessRuntime", "RuntimeConfig", "session",
                "RuntimeGPU", "RuntimeResources", "RuntimeLimits", "file_tracking_observer",
                "DaytonaRuntime", "HUDRuntime"}
    assert expected <= set(durable_rollouts.__all__)
    for module in (durable_rollouts, durable_rollouts.sdk, durable_rollouts.runtimes, durable_rollouts.graders):
        assert module.__all__ == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert getattr(module, name) is not None
    from durable_rollouts import Environment
    from durable_rollouts.envserver import Environment as Direct

    assert Environment is Direct
    from durable_rollouts.sdk.lifetime import session

    assert durable_rollouts.session is session


def test_importing_the_package_loads_nothing_heavy() -> None:
    code = (
        "import sys, durable_rollouts\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('temporalio', 'httpx', 'docker', 'modal', 'asyncssh')]\n"
        "ours = sorted(m for m in sys.modules if m.startswith('durable_rollouts'))\n"
        "print(heavy, ours)\n"
        "from durable_rollouts import Taskset, LocalRuntime\n"
        "assert not [m for m in sys.modules if m.startswith('temporalio')], 'temporalio imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] ['durable_rollouts']"
