"""Which provider a batch runs on: the ``runtime=`` a caller passed, or seed 001's default.

``runtime=None`` resolves as seed 001 lists: rows that name the ``.py`` file declaring their
environment (a taskset loaded from ``.py`` source, or rows made by calling a template of an
imported module: a template's rows carry its file), and rows naming an env that a module imported
in this process declares, are served from that file, freshly per rollout (``LocalRuntime()``).
Anything else is an error naming the forms to pass. Any other
``runtime`` goes through :func:`~.providers.callables.as_provider`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models import ProviderSpec, Task
from ..runtimes.base import DurableProvider
from ..runtimes.callables import as_provider
from ..runtimes.local import LocalRuntime

__all__ = ["check_remote_provider", "resolve_placement"]

FORMS = ("runtime=LocalRuntime('env.py'), SubprocessRuntime('env.py'), DockerRuntime(image), "
         "Runtime('tcp://host:port'), or any (task) -> async context manager yielding a Runtime")


def resolve_placement(runtime: Any, rows: Iterable[Task]) -> DurableProvider:
    """The provider for a batch of ``rows``.

    Raises:
        ConfigError: ``runtime`` is None and some row names no env file; or ``runtime`` is not
            a provider.
    """
    if runtime is not None:
        return as_provider(runtime)
    homeless = [t.slug for t in rows if not _served_from_file(t)]
    if homeless:
        shown = ", ".join(homeless[:3]) + (" ..." if len(homeless) > 3 else "")
        raise ConfigError(f"no runtime given and row(s) {shown} name no env.py file to serve "
                          f"them from; pass {FORMS}")
    return LocalRuntime()


def check_remote_provider(spec: ProviderSpec) -> None:
    """Raise ConfigError when ``spec`` is a process-local handle (a lambda, a closure, a live
    Environment) and the batch has no worker in this process to use it."""
    local_only = ((spec.kind == "callable" and not spec.options.get("path"))
                  or (spec.kind == "local" and "instance" in spec.options))
    if spec.kind == "modal" and spec.options.get("image_handle") and not spec.options.get("image_id"):
        from ..runtimes.modal import MODAL_IMAGE_ELSEWHERE  # lazily: modal batches only

        raise ConfigError(MODAL_IMAGE_ELSEWHERE)
    if local_only:
        raise ConfigError("the runtime is a lambda, a closure or a live Environment that only "
                          "exists in this process, and this batch runs on workers elsewhere: "
                          "pass an env file path or a module-level provider (module:attr)")


def _served_from_file(task: Task) -> bool:
    from ..envserver.environment import declared_source  # lazily: only runtime=None needs it

    rows = [task] if task.verifier is None else [task, task.verifier]
    return all(_names_file(r) or declared_source(r.env) is not None for r in rows)


def _names_file(task: Task) -> bool:
    return bool(task.source) and str(task.source).endswith(".py") and Path(str(task.source)).is_file()
