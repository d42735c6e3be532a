"""Seed 003's taskset flags, checked before a batch starts (both orchestrators).

``Taskset.REQUIRES_GROUP_ROLLOUTS``: the taskset's ``resolve_task`` binds state every member of
a group must share (it is called once per group), so single rollouts are refused.
``Taskset.NEEDS_CONTAINER``: the taskset's environment must run in a container, so runtimes
that run it on this host (``local``, ``subprocess``) or on a host of yours (``ssh``) are refused.
Both are plain attributes: a subclass sets them, or an instance from its config.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["check_taskset_flags"]

HOST_KINDS = frozenset({"local", "subprocess", "ssh"})  # runtimes that run no container


def check_taskset_flags(taskset: Any, *, group: int, runtime: Any) -> None:
    """Raise ConfigError when ``group`` or ``runtime`` breaks a flag ``taskset`` sets."""
    name = getattr(taskset, "name", type(taskset).__name__)
    if getattr(taskset, "REQUIRES_GROUP_ROLLOUTS", False) and group < 2:
        raise ConfigError(f"taskset {name!r} requires group rollouts (REQUIRES_GROUP_ROLLOUTS): "
                          f"run it with group >= 2, not {group}")
    kind = getattr(runtime, "kind", "")
    if getattr(taskset, "NEEDS_CONTAINER", False) and kind in HOST_KINDS:
        raise ConfigError(f"taskset {name!r} needs a container (NEEDS_CONTAINER), and "
                          f"{type(runtime).__name__} runs none: use DockerRuntime, ModalRuntime, "
                          "DaytonaRuntime or HUDRuntime")
