"""Recognising HUD v6 objects (PyPI ``hud``) without importing hud, and the error when it is missing.

A ``hud.Environment``, ``hud.eval.Task`` or ``hud.agents.base.Agent`` can only exist once the
user's own code imported hud, so these checks look the classes up in ``sys.modules`` and never
import anything: importing durable_rollouts stays free of hud (and of the patches hud applies to
other libraries when it is imported). Used by ``envserver`` (serving a HUD env file) and ``sdk``
(HUD task rows and agents). Imports only the shared errors module.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from .errors import ConfigError

__all__ = [
    "HUD_INSTALL_HINT",
    "hud_class",
    "import_hud",
    "is_hud_agent_class",
    "is_hud_environment",
    "is_hud_task",
    "is_hud_taskset",
    "missing_hud",
]

HUD_INSTALL_HINT = "pip install 'durable-rollouts[hud]'"
"""What to run when a HUD env file, task or agent meets an installation without hud."""

_ENVIRONMENT = ("hud.environment.env", "Environment")
_TASK = ("hud.eval.task", "Task")
_TASKSET = ("hud.eval.taskset", "Taskset")
_AGENT = ("hud.agents.base", "Agent")


def hud_class(module: str, name: str) -> type | None:
    """``module.name`` when hud already imported that module, else None (nothing is imported)."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None) if loaded is not None else None
    return found if isinstance(found, type) else None


def is_hud_environment(obj: Any) -> bool:
    """Whether ``obj`` is a ``hud.Environment`` (a HUD v6 env file's environment)."""
    cls = hud_class(*_ENVIRONMENT)
    return cls is not None and isinstance(obj, cls)


def is_hud_task(obj: Any) -> bool:
    """Whether ``obj`` is a ``hud.eval.Task`` row (what calling a HUD template returns)."""
    cls = hud_class(*_TASK)
    return cls is not None and isinstance(obj, cls)


def is_hud_taskset(obj: Any) -> bool:
    """Whether ``obj`` is a ``hud.eval.Taskset`` (iterating it gives its ``hud.eval.Task`` rows)."""
    cls = hud_class(*_TASKSET)
    return cls is not None and isinstance(obj, cls)


def is_hud_agent_class(obj: Any) -> bool:
    """Whether ``obj`` is a subclass of ``hud.agents.base.Agent``."""
    cls = hud_class(*_AGENT)
    return cls is not None and isinstance(obj, type) and issubclass(obj, cls)


def missing_hud(exc: BaseException, what: str) -> ConfigError | None:
    """The one-line error for ``what`` failing to import because hud is not installed, else None."""
    name = getattr(exc, "name", None) or ""
    if isinstance(exc, ModuleNotFoundError) and name.split(".")[0] == "hud":
        return ConfigError(f"{what} imports {name!r} (HUD v6), which is not installed: {HUD_INSTALL_HINT}")
    return None


def import_hud(module: str, what: str) -> ModuleType:
    """Import a hud module on behalf of ``what``; ConfigError with the install hint when absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        error = missing_hud(exc, what)
        if error is None:
            raise
        raise error from None
