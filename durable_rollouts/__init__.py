"""durable_rollouts: agent rollouts against RL environments, made durable by Temporal.

The public names below load lazily on first use, so ``import durable_rollouts`` has no side
effects and imports neither Temporal nor the environment server (workflows import
``durable_rollouts.models`` inside Temporal's sandbox, which imports this package first).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .envserver import Answer, Capability, Environment
    from .models import (
        Grade,
        RuntimeConfig,
        RuntimeGPU,
        RuntimeLimits,
        RuntimeResources,
        Step,
        Task,
        Trace,
    )
    from .runtimes import LocalRuntime, Runtime, SubprocessRuntime
    from .runtimes.daytona import DaytonaRuntime
    from .runtimes.docker import DockerRuntime
    from .runtimes.hud import HUDRuntime
    from .runtimes.modal import ModalRuntime
    from .runtimes.ssh import SSHRuntime
    from .sdk.agents import Agent
    from .sdk.atom import rollout
    from .sdk.file_tracking import file_tracking_observer
    from .sdk.job import Job
    from .sdk.lifetime import session
    from .sdk.run import Run
    from .sdk.taskset import Taskset

__all__ = [
    "Agent",
    "Answer",
    "Capability",
    "DaytonaRuntime",
    "DockerRuntime",
    "Environment",
    "Grade",
    "HUDRuntime",
    "Job",
    "LocalRuntime",
    "ModalRuntime",
    "Run",
    "Runtime",
    "RuntimeConfig",
    "RuntimeGPU",
    "RuntimeLimits",
    "RuntimeResources",
    "SSHRuntime",
    "Step",
    "SubprocessRuntime",
    "Task",
    "Taskset",
    "Trace",
    "file_tracking_observer",
    "rollout",
    "session",
]

_WHERE = {
    "Agent": "durable_rollouts.sdk.agents",
    "Answer": "durable_rollouts.envserver",
    "Capability": "durable_rollouts.envserver",
    "DaytonaRuntime": "durable_rollouts.runtimes.daytona",
    "DockerRuntime": "durable_rollouts.runtimes.docker",
    "Environment": "durable_rollouts.envserver",
    "Grade": "durable_rollouts.models",
    "HUDRuntime": "durable_rollouts.runtimes.hud",
    "Job": "durable_rollouts.sdk.job",
    "LocalRuntime": "durable_rollouts.runtimes",
    "ModalRuntime": "durable_rollouts.runtimes.modal",
    "Run": "durable_rollouts.sdk.run",
    "Runtime": "durable_rollouts.runtimes",
    "RuntimeConfig": "durable_rollouts.models",
    "RuntimeGPU": "durable_rollouts.models",
    "RuntimeLimits": "durable_rollouts.models",
    "RuntimeResources": "durable_rollouts.models",
    "SSHRuntime": "durable_rollouts.runtimes.ssh",
    "Step": "durable_rollouts.models",
    "SubprocessRuntime": "durable_rollouts.runtimes",
    "Task": "durable_rollouts.models",
    "Taskset": "durable_rollouts.sdk.taskset",
    "Trace": "durable_rollouts.models",
    "file_tracking_observer": "durable_rollouts.sdk.file_tracking",
    "rollout": "durable_rollouts.sdk.atom",
    "session": "durable_rollouts.sdk.lifetime",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_rollouts' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
