"""Up-front checks of a batch, run before anything starts (both orchestrators use them).

Imports models, errors and the provider base only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError
from ..models import Task
from ..runtimes.base import DurableProvider

__all__ = ["validate_batch"]


def validate_batch(tasks: Iterable[Task], *, runtime: Any, group: int, max_concurrent: int,
                   rollout_timeout: float | None, agent_timeout: float | None) -> None:
    """Raise ConfigError for any setting that cannot work, naming the offending row.

    Checks: ``group`` and ``max_concurrent`` are positive, ``rollout_timeout`` is positive, the
    agent timeout is below each row's ``run_timeout_s`` and below ``rollout_timeout``, every
    startup/run limit (actor and verifier) is below ``rollout_timeout``, and the runtime can
    honour every row's RuntimeConfig.
    """
    if not isinstance(group, int) or group < 1:
        raise ConfigError(f"group must be a positive integer, not {group!r}")
    if not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ConfigError(f"max_concurrent must be a positive integer, not {max_concurrent!r}")
    if rollout_timeout is not None and rollout_timeout <= 0:
        raise ConfigError(f"rollout_timeout must be > 0 seconds, not {rollout_timeout!r}")
    if agent_timeout is not None and rollout_timeout is not None and agent_timeout >= rollout_timeout:
        raise ConfigError(f"the agent timeout ({agent_timeout}s) must be shorter than "
                          f"rollout_timeout ({rollout_timeout}s)")
    for task in tasks:
        for what, row in (("task", task), ("verifier of", task.verifier)):
            if row is None or row.runtime_config is None:
                continue
            name = f"{what} {task.slug}"
            limits = row.runtime_config.limits
            if agent_timeout is not None and limits.run_timeout_s is not None and row is task \
                    and agent_timeout >= limits.run_timeout_s:
                raise ConfigError(f"{name}: the agent timeout ({agent_timeout}s) must be shorter "
                                  f"than limits.run_timeout_s ({limits.run_timeout_s}s)")
            if rollout_timeout is not None:
                for field in ("startup_timeout_s", "run_timeout_s"):
                    value = getattr(limits, field)
                    if value is not None and value >= rollout_timeout:
                        raise ConfigError(f"{name}: limits.{field} ({value}s) must be shorter "
                                          f"than rollout_timeout ({rollout_timeout}s)")
        if isinstance(runtime, DurableProvider):
            runtime.check_task(task)
