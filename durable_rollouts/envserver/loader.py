"""Find the :class:`Environment` an ``env.py`` (or a module) defines.

``load_environment("path/to/env.py")``, ``load_environment("pkg.module")`` or
``load_environment("pkg.module:attr")``. When a module defines several environments, ``name``
picks one by attribute name or by ``Environment.name``.

Imports only ``environment.py`` and the shared errors module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError
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
    except Exception:
        sys.modules.pop(module_name, None)
        raise
    finally:
        with_path = str(path.parent)
        if with_path in sys.path:
            sys.path.remove(with_path)
    return module


def load_environment(target: str, name: str | None = None) -> Environment:
    """Load the environment defined by ``target`` (a ``.py`` path, ``module`` or ``module:attr``).

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
            raise ConfigError(f"cannot import environment module {module_name!r}: {exc}") from exc
        source = getattr(module, "__file__", None)
        attr = attr or None
    if attr is not None:
        env = getattr(module, attr, None)
        if not isinstance(env, Environment):
            raise ConfigError(f"{target}: {attr!r} is not an Environment")
    else:
        env = _pick(module, target, name)
    if source is not None and env.source is None:
        env.source = source
    return env


def _pick(module: ModuleType, target: str, name: str | None) -> Environment:
    found = {k: v for k, v in vars(module).items() if isinstance(v, Environment)}
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
