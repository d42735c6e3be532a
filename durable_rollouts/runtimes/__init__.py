"""Providers (runtimes): where a task's environment runs, as objects and as specs.

``provider_from_spec`` rebuilds a provider on a worker from its ``ProviderSpec``: a built-in kind
(``runtime``, ``local``, ``subprocess``, plus kinds added with ``register_provider``) or a
``module:Class`` path whose class has ``from_options(options)``. Importing this package imports
no environment code and no optional SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..models import ProviderSpec
from ..moved import import_path
from .base import DurableProvider, Locality, Runtime
from .local import LocalRuntime
from .subprocess import SubprocessRuntime

__all__ = [
    "DurableProvider",
    "LocalRuntime",
    "Locality",
    "Runtime",
    "SubprocessRuntime",
    "provider_classes",
    "provider_from_spec",
    "register_provider",
]

def _lazy(module: str, cls: str) -> Callable[[dict[str, Any]], DurableProvider]:
    # docker/ssh/modal/daytona/hud load on first use, so importing this package imports no optional SDK.
    return lambda options: getattr(importlib.import_module(f"{__name__}.{module}"), cls).from_options(options)


_KINDS: dict[str, Callable[[dict[str, Any]], DurableProvider]] = {
    Runtime.kind: Runtime.from_options,
    LocalRuntime.kind: LocalRuntime.from_options,
    SubprocessRuntime.kind: SubprocessRuntime.from_options,
    "docker": _lazy("docker", "DockerRuntime"),
    "ssh": _lazy("ssh", "SSHRuntime"),
    "modal": _lazy("modal", "ModalRuntime"),
    "daytona": _lazy("daytona", "DaytonaRuntime"),
    "hud": _lazy("hud", "HUDRuntime"),
    "callable": _lazy("callables", "CallableProvider"),  # any (task) -> async context manager
}


_BUILT_IN = (Runtime, LocalRuntime, SubprocessRuntime)
_OPTIONAL = (("docker", "DockerRuntime"), ("ssh", "SSHRuntime"), ("modal", "ModalRuntime"),
             ("daytona", "DaytonaRuntime"), ("hud", "HUDRuntime"))


def provider_classes() -> list[type[DurableProvider]]:
    """Every built-in provider class (gc asks each for its substrates; modules load lazily)."""
    optional = [getattr(importlib.import_module(f"{__name__}.{m}"), c) for m, c in _OPTIONAL]
    return [*optional, *_BUILT_IN]


def register_provider(kind: str, factory: Callable[[dict[str, Any]], DurableProvider]) -> None:
    """Make ``ProviderSpec(kind=kind, options=...)`` rebuild with ``factory(options)``."""
    _KINDS[kind] = factory


def provider_from_spec(spec: ProviderSpec) -> DurableProvider:
    """Rebuild a provider from its spec.

    Raises:
        ConfigError: an unknown kind, an unimportable class, or invalid options.
    """
    factory = _KINDS.get(spec.kind)
    if factory is None:
        module_name, sep, qualname = spec.kind.partition(":")
        if not sep:
            raise ConfigError(f"unknown provider kind {spec.kind!r}; built-ins: {', '.join(sorted(_KINDS))}")
        try:
            factory = import_path(module_name, qualname).from_options
        except Exception as exc:
            raise ConfigError(f"cannot load provider {spec.kind!r}: {exc}") from exc
    try:
        return factory(dict(spec.options))
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"invalid options for provider {spec.kind!r}: {exc}") from exc
