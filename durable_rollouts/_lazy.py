"""Lazy re-exports for the seeds' module paths (``environment``, ``capabilities``, ``eval``,
``agents``): a name's home module is imported on first use, so importing one of them stays as
cheap as ``import durable_rollouts`` and no import cycle can form through them."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(module: str, where: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``module``, whose name ``N`` lives in ``where[N]``."""

    def __getattr__(name: str) -> Any:
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[module], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(where))

    return __getattr__, __dir__
