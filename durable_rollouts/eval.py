"""The seeds' ``hud.eval``: tasks, tasksets, jobs, runs, runtimes and the rollout atom.

Re-exports only (loaded lazily, so this imports neither Temporal nor the env server until a
name is used). hud.ai's cloud names (``HostedRuntime``, ``SyncPlan``, ``Taskset.from_api``)
are not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    pass

_PROVIDERS = "durable_rollouts.runtimes"
_WHERE = {
    "DaytonaRuntime": f"{_PROVIDERS}.daytona",
    "DockerRuntime": f"{_PROVIDERS}.docker",
    "Grade": "durable_rollouts.models",
    "HUDRuntime": f"{_PROVIDERS}.hud",
    "Job": "durable_rollouts.sdk.job",
    "LocalRuntime": _PROVIDERS,
    "ModalRuntime": f"{_PROVIDERS}.modal",
    "Run": "durable_rollouts.sdk.run",
    "Runtime": _PROVIDERS,
    "RuntimeConfig": "durable_rollouts.models",
    "RuntimeGPU": "durable_rollouts.models",
    "RuntimeLimits": "durable_rollouts.models",
    "RuntimeResources": "durable_rollouts.models",
    "SSHRuntime": f"{_PROVIDERS}.ssh",
    "SubprocessRuntime": _PROVIDERS,
    "Task": "durable_rollouts.models",
    "Taskset": "durable_rollouts.sdk.taskset",
    "Trace": "durable_rollouts.models",
    "rollout": "durable_rollouts.sdk.atom",
}
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
