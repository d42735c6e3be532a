"""Find the :class:`Environment` an ``env.py`` (or a module) defines.

``load_environment("path/to/env.py")``, ``load_environment("pkg.module")`` or
``load_environment("pkg.module:attr")``. When a module defines several environments, ``name``
picks one by attribute name or by ``Environment.name``. A HUD v6 env file's ``hud.Environment``
counts too (``server.serving`` serves it with hud's own server); when such a file cannot import
hud, the error says how to install it.

A user's file is run by :func:`import_file`, which lets it import the modules next to it (as
``python env.py`` would) without touching ``sys.path``: while the file runs, a finder placed just
before Python's path finder resolves top-level names in the file's folder first (for the thread
running the file only), and it is removed afterwards. Imports only ``environment.py`` and the
shared errors and hud_detect modules.

A worker loads env files with :func:`load_environment_async`: a file not imported yet runs in a
thread, so an import that takes seconds never stalls the worker's event loop (other rollouts'
heartbeats, issue #39). Env files are run one at a time (a lock), so a second caller waits for the
first import and then finds the whole module, never a half-run one.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError
from ..hud_detect import is_hud_environment, missing_hud
from .environment import Environment

__all__ = ["forget_fresh", "import_file", "load_environment", "load_environment_async"]

_FILE_IMPORTS = threading.RLock()  # env files run one at a time (re-entrant: one may load another)
_WHOLE: set[str] = set()  # env file modules that finished running


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds top-level modules and packages in one folder (what ``sys.path[0]`` of a script does),
    for imports made by the thread that runs the file (others, e.g. the event loop's, never see
    the folder)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.thread = threading.get_ident()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None:  # a submodule: its package's own __path__ finds it
            return None
        if threading.get_ident() != self.thread:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.folder])


@contextlib.contextmanager
def _siblings_importable(folder: Path) -> Iterator[None]:
    """While inside, ``import x`` also finds ``folder/x.py`` (before installed modules, after
    built-in ones); nothing outside the block sees it."""
    finder = _FolderFinder(str(folder))
    before = next((i for i, f in enumerate(sys.meta_path)
                   if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(before, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


_CODE: dict[tuple[Path, int, int], Any] = {}  # (path, mtime, size) -> its compiled code


def import_file(path: Path, module_name: str) -> ModuleType:
    """Run the Python file ``path`` as module ``module_name`` (kept in ``sys.modules``); its
    sibling modules are importable while it runs. Its compiled code is kept per process, for a
    file loaded once per rollout.

    Raises:
        ConfigError: ``path`` cannot be imported at all.
        Exception: whatever the file raised (the module is then dropped again).
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with _siblings_importable(path.parent):
            exec(_code(path, spec.loader), module.__dict__)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        no_hud = missing_hud(exc, str(path))
        if no_hud is not None:
            raise no_hud from None
        raise
    return module


def _code(path: Path, loader: Any) -> Any:
    stat = path.stat()
    key = (path, stat.st_mtime_ns, stat.st_size)
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = loader.get_code(loader.name)
    return code


def _import_env_name(path: Path) -> str:
    return f"_rollouts_env_{abs(hash(str(path)))}"


def _import_env_file(path: Path, fresh: bool = False) -> ModuleType:
    module_name = _import_env_name(path)
    with _FILE_IMPORTS:  # a module in sys.modules while another thread still runs it is half-made
        if fresh:  # run the file again as a module of its own; what it imports stays cached
            return import_file(path, f"{module_name}_{next(_FRESH)}")
        module = sys.modules.get(module_name) or import_file(path, module_name)
        _WHOLE.add(module_name)
        return module


def _imported(target: str) -> bool:
    """Whether loading ``target`` needs no import and no wait (its module is whole); never blocks."""
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            return True  # load_environment raises its error at once
        name = _import_env_name(path.resolve())
        return name in _WHOLE and name in sys.modules
    module = sys.modules.get(target.partition(":")[0])
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


async def load_environment_async(target: str, name: str | None = None, **options: Any) -> Any:
    """:func:`load_environment` (``options`` passed on) without blocking the event loop: a module
    not imported yet, or a file run afresh, is imported in a thread (the loop keeps serving other
    rollouts meanwhile)."""
    if not options.get("fresh") and _imported(target):
        return load_environment(target, name, **options)
    return await asyncio.to_thread(load_environment, target, name, **options)


_FRESH = itertools.count(1)
_FRESH_MODULES: dict[int, str] = {}  # id(env) -> the module a fresh load ran


def forget_fresh(env: Any) -> None:
    """Drop the module a ``fresh=True`` load of ``env`` ran (its rollout is over)."""
    module_name = _FRESH_MODULES.pop(id(env), None)
    if module_name is not None:
        sys.modules.pop(module_name, None)


def load_environment(target: str, name: str | None = None, *, fresh: bool = False) -> Any:
    """Load the environment defined by ``target`` (a ``.py`` path, ``module`` or ``module:attr``):
    an :class:`Environment`, or a HUD v6 ``hud.Environment``.

    ``fresh=True`` runs a ``.py`` file again (a new Environment, its own module globals) instead
    of reusing the module loaded before; the modules the file imports stay cached. Modules named
    by import path are always the cached one.

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
        module = _import_env_file(path, fresh)
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
    if fresh and module.__name__ != _import_env_name(path):
        _FRESH_MODULES[id(env)] = module.__name__
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
