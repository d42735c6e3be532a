"""Module paths of earlier releases that have moved, and where they live now.

Specs saved by earlier releases name classes by module path: a ``ProviderSpec`` kind such as
``durable_rollouts.sdk.providers.docker:DockerRuntime``, an ``AgentSpec`` path, a taskset class.
Workflow histories, memos, export files and user code may still hold them, so every loader of a
``module:Qual.Name`` path imports through :func:`import_module`, which follows this table.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "current", "import_module", "import_path"]

MOVED: dict[str, str] = {  # module of an earlier release -> its module now (longest prefix wins)
    "durable_rollouts.sdk.providers": "durable_rollouts.runtimes",
    "durable_rollouts.sdk.labels": "durable_rollouts.runtimes.labels",
    "durable_rollouts.sdk.procs": "durable_rollouts.runtimes.procs",
    "durable_rollouts.sdk.locks": "durable_rollouts.locks",
    "durable_rollouts.sdk.paths": "durable_rollouts.paths",
    "durable_rollouts.sdk.client": "durable_rollouts.client.envclient",
    "durable_rollouts.sdk.capabilities": "durable_rollouts.client.capabilities",
    "durable_rollouts.sdk.channel": "durable_rollouts.client.channel",
    "durable_rollouts.sdk.kept": "durable_rollouts.client.kept",
    "durable_rollouts.sdk.tokens": "durable_rollouts.client.tokens",
    "durable_rollouts.sdk.steps": "durable_rollouts.steps.substrate",
    "durable_rollouts.sdk.agent_step": "durable_rollouts.steps.agent",
    "durable_rollouts.sdk.agent_call": "durable_rollouts.steps.agent_call",
    "durable_rollouts.sdk.verifier": "durable_rollouts.steps.verifier",
    "durable_rollouts.sdk.verify_once": "durable_rollouts.steps.verify_once",
    "durable_rollouts.sdk.tracestore": "durable_rollouts.stores.tracestore",
    "durable_rollouts.sdk.blobs": "durable_rollouts.stores.blobs",
    "durable_rollouts.sdk.board": "durable_rollouts.temporal.board",
    "durable_rollouts.sdk.merged_steps": "durable_rollouts.activities.legacy_steps",
    "durable_rollouts.workflows.ids": "durable_rollouts.ids",
}


def current(name: str) -> str:
    """Where module ``name`` lives now (``name`` itself unless it moved)."""
    best = max((old for old in MOVED if name == old or name.startswith(old + ".")), key=len, default=None)
    return name if best is None else MOVED[best] + name[len(best):]


def import_module(name: str) -> ModuleType:
    """``importlib.import_module`` of where ``name`` lives now."""
    return importlib.import_module(current(name))


def import_path(module: str, qualname: str) -> Any:
    """The object ``module:qualname`` names (``qualname`` may be dotted), following :data:`MOVED`.

    Raises whatever importing the module or walking the attributes raised; each caller words its
    own error (a provider, an agent, a taskset).
    """
    obj: Any = import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
