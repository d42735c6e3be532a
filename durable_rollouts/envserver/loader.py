"""Find the :class:`Environment` an ``env.py`` (or a module) defines.

``load_environment("path/to/env.py")``, ``load_environment("pkg.module")`` or
``load_environment("pkg.module:attr")``. When a module defines several environments, ``name``
picks one by attribute name or by ``Environment.name``. A HUD v6 env file's ``hud.Environment``
counts too (``server.serving`` serves it with hud's own server); when such a file cannot import
hud, the error says how to install it.

Imports only ``environment.py`` and the shared errors and hudcompat modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError
from ..hudcompat import is_hud_environment, missing_hud
from .environment import Environment

__all__ = ["load_environment"]


def _import_file(path: Path) -> ModuleType:
    module_name = f"_rollouts_env_{abs(hash(str(path)))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # let the env file import its sibling modules
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        no_hud = missing_hud(exc, str(path))
        if no_hud is not None:
            raise no_hud from None
        raise
    finally:
        with_path = str(path.parent)
        if with_path in sys.path:
            sys.path.remove(with_path)
    return module


def load_environment(target: str, name: str | None = None) -> Any:
    """Load the environment defined by ``target`` (a ``.py`` path, ``module`` or ``module:attr``):
    an :class:`Environment`, or a HUD v6 ``hud.Environment``.

    Raises:
        ConfigError: the target cannot be found or defines no (or several, without ``name``)
            environments.
    """
    attr: str | None = None
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"environment file not found: {target}")
        path = path.resolve()
        module = _import_file(path)
        source: str | None = str(path)
    else:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            no_hud = missing_hud(exc, module_name)
            raise no_hud or ConfigError(f"cannot import environment module {module_name!r}: {exc}") from exc
        source = getattr(module, "__file__", None)
        attr = attr or None
    if attr is not None:
        env = getattr(module, attr, None)
        if not _is_environment(env):
            raise ConfigError(f"{target}: {attr!r} is not an Environment")
    else:
        env = _pick(module, target, name)
    if source is not None and isinstance(env, Environment) and env.source is None:
        env.source = source
    return env


def _is_environment(value: object) -> bool:
    return isinstance(value, Environment) or is_hud_environment(value)


def _pick(module: ModuleType, target: str, name: str | None) -> Any:
    found = {k: v for k, v in vars(module).items() if _is_environment(v)}
    if name is not None:
        matches = [v for k, v in found.items() if name in (k, v.name)]
        if not matches:
            raise ConfigError(f"{target} defines no environment named {name!r}")
        return matches[0]
    unique = list({id(v): v for v in found.values()}.values())
    if not unique:
        raise ConfigError(f"{target} defines no Environment")
    if len(unique) > 1:
        names = ", ".join(sorted(found))
        raise ConfigError(f"{target} defines several environments ({names}); pick one with --env")
    return unique[0]
