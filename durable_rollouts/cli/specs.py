"""Parse the CLI's option strings: taskset files, ``--agent`` and ``--runtime`` specs, JSON.

Every user mistake becomes a ``ConfigError`` with one readable message (the CLI prints it and
exits 2). Imports the sdk lazily (agents, providers, taskset); never Temporal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..errors import ConfigError
from ..moved import import_path
from ..settings import settings

__all__ = [
    "RUNTIME_KINDS",
    "add_cwd_to_path",
    "admit_runtime",
    "check_sources",
    "load_agent_spec",
    "load_tasks",
    "parse_json_object",
    "parse_runtime",
    "ssh_key_default",
]

RUNTIME_KINDS = (
    "local[:ENV.py], local-shared[:ENV.py], subprocess[:ENV.py], docker:IMAGE, modal:IMAGE, daytona:SNAPSHOT, hud[:ENV], "
    "ssh://USER@HOST[:PORT]/WORKDIR, tcp://HOST:PORT, or MODULE:ATTR (any provider callable)"
)


def parse_json_object(raw: str | None, option: str) -> dict[str, Any]:
    """``raw`` as a JSON object (``{}`` when empty); ConfigError naming ``option`` otherwise."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} must be a JSON object, got {type(value).__name__}")
    return value


def load_tasks(path: str, name: str | None = None) -> Any:
    """Load a ``Taskset`` from a ``.py``, ``.json`` or ``.jsonl`` file."""
    from ..sdk.taskset import Taskset

    file = Path(path)
    if not file.exists():
        raise ConfigError(f"tasks file not found: {path}")
    if file.is_dir():
        raise ConfigError(f"tasks file is a directory: {path} (give a .py, .json or .jsonl file)")
    taskset = Taskset.from_file(file, name=name)
    envs = {task.env for task in taskset}
    if name is None and taskset.name in ("env", "tasks") and len(envs) == 1:
        taskset.name = envs.pop()  # examples/letters/env.py -> "letters", not "env"
    return taskset


def add_cwd_to_path() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(
            cwd
        )  # `rollouts run --agent mymod:Agent` from the project directory (last: never shadows)


def load_agent_spec(spec: str, config: dict[str, Any]) -> Any:
    """Build the agent named by ``spec``: a built-in short name, ``module:Class`` or ``file.py:Class``.

    The agent is built here once so a typo or a bad config fails before anything starts.
    """
    from ..models import AgentSpec
    from ..sdk.agents import BUILTIN_AGENTS, load_agent

    if spec not in BUILTIN_AGENTS:
        module, sep, qualname = spec.partition(":")
        if not sep:
            raise ConfigError(
                f"unknown agent {spec!r}: use a built-in ({', '.join(sorted(BUILTIN_AGENTS))}) "
                "or an import path module:Class"
            )
        if module.endswith(".py"):
            file = Path(module)
            if not file.is_file():
                raise ConfigError(f"agent file not found: {module}")
            folder = str(file.resolve().parent)
            if folder not in sys.path:
                sys.path.append(folder)
            spec = f"{file.stem}:{qualname}"
        add_cwd_to_path()
    return load_agent(AgentSpec(path=spec, config=config))


def ssh_key_default() -> str | None:
    """``$ROLLOUTS_SSH_KEY``, else the first of ~/.ssh/id_ed25519, id_ecdsa, id_rsa that exists."""
    key = settings().ssh_key
    if key:
        return str(key)
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        candidate = Path.home() / ".ssh" / name
        if candidate.is_file():
            return str(candidate)
    return None


def _optional_provider(module: str, cls: str, what: str) -> Any:
    if importlib.util.find_spec(f"durable_rollouts.runtimes.{module}") is None:
        raise ConfigError(f"the {what} runtime is not available in this installation")
    try:
        mod = importlib.import_module(f"durable_rollouts.runtimes.{module}")
    except ImportError as exc:
        raise ConfigError(f"the {what} runtime is not available: {exc}") from None
    return getattr(mod, cls)


def _env_file(rest: str, kind: str) -> str | None:
    if not rest:
        return None
    if not Path(rest).is_file():
        raise ConfigError(f"--runtime {kind}:{rest}: env file not found")
    return str(Path(rest).resolve())


def _ssh_runtime(spec: str) -> Any:
    parsed = urlparse(spec)
    if not parsed.hostname or not parsed.username:
        raise ConfigError(f"--runtime {spec!r}: expected ssh://USER@HOST[:PORT]/WORKDIR")
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    key = query.pop("key", None) or ssh_key_default()
    if key is None:
        raise ConfigError(
            "--runtime ssh://...: no SSH key found; add ?key=PATH or set ROLLOUTS_SSH_KEY"
        )
    unknown = sorted(set(query) - {"python", "known_hosts", "env"})
    if unknown:
        raise ConfigError(
            f"--runtime ssh://...: unknown option(s) {', '.join(unknown)} "
            "(known: key, python, known_hosts, env)"
        )
    try:
        port = parsed.port or 22
    except ValueError as exc:
        raise ConfigError(f"--runtime {spec!r}: {exc}") from None
    cls = _optional_provider("ssh", "SSHRuntime", "ssh")
    workdir = parsed.path.lstrip("/") or ".durable-rollouts"
    return cls(parsed.hostname, parsed.username, key, port=port, workdir=workdir, **query)


def _imported_provider(module: str, attr: str) -> Any:
    """``--runtime MODULE:ATTR``: a provider object or any ``(task) -> async context manager``
    (workers elsewhere import it by the same path)."""
    from ..runtimes.base import DurableProvider
    from ..runtimes.callables import CallableProvider

    add_cwd_to_path()
    try:
        obj: Any = import_path(module, attr)
    except Exception as exc:
        raise ConfigError(f"--runtime {module}:{attr}: cannot import it: {type(exc).__name__}: "
                          f"{exc} (is its folder on PYTHONPATH?)") from None
    if not callable(obj):
        raise ConfigError(f"--runtime {module}:{attr} is a {type(obj).__name__}, not a provider "
                          "((task) -> async context manager yielding a Runtime)")
    return obj if isinstance(obj, DurableProvider) else CallableProvider(obj, path=f"{module}:{attr}")


def admit_runtime(runtime: Any, max_provisions_per_s: float | None, max_substrates: int | None) -> None:
    """Set ``--max-provisions-per-s`` / ``--max-substrates`` on a runtime that places substrates.

    Raises:
        ConfigError: a borrowed server (``tcp://``: nothing to admit) or an invalid value.
    """
    from ..runtimes import Runtime

    if max_provisions_per_s is None and max_substrates is None:
        return
    if isinstance(runtime, Runtime) or not hasattr(runtime, "admit"):
        raise ConfigError("--max-provisions-per-s/--max-substrates need a runtime that places "
                          "substrates (not a running server, tcp://)")
    runtime.admit(max_provisions_per_s, max_substrates)


def parse_runtime(spec: str) -> Any:
    """Build the provider named by ``spec`` (see :data:`RUNTIME_KINDS`)."""
    from ..runtimes import LocalRuntime, Runtime, SubprocessRuntime

    spec = spec.strip()
    if spec.startswith("tcp://"):
        parsed = urlparse(spec)
        try:
            ok = bool(parsed.hostname) and parsed.port is not None
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"--runtime {spec!r}: expected tcp://HOST:PORT")
        token = settings().env_token
        return Runtime(spec, {"token": token.get_secret_value()} if token else {})
    if spec.startswith("ssh://"):
        return _ssh_runtime(spec)
    kind, _, rest = spec.partition(":")
    if kind == "local":
        return LocalRuntime(_env_file(rest, kind))
    if kind == "local-shared":  # one server per env for all of a worker's rollouts
        return LocalRuntime(_env_file(rest, kind), shared=True)
    if kind == "subprocess":
        return SubprocessRuntime(_env_file(rest, kind))
    if kind == "docker":
        if not rest:
            raise ConfigError("--runtime docker:IMAGE needs an image name")
        return _optional_provider("docker", "DockerRuntime", "docker")(rest)
    if kind == "modal":
        if not rest:
            raise ConfigError("--runtime modal:IMAGE needs an image name")
        return _optional_provider("modal", "ModalRuntime", "modal")(rest)
    if kind == "daytona":
        if not rest:
            raise ConfigError("--runtime daytona:SNAPSHOT needs a Daytona snapshot name")
        return _optional_provider("daytona", "DaytonaRuntime", "daytona")(rest)
    if kind == "hud":
        return _optional_provider("hud", "HUDRuntime", "hud")(environment=rest or None)
    if rest and all(part.isidentifier() for part in (*kind.split("."), *rest.split("."))):
        return _imported_provider(kind, rest)
    raise ConfigError(f"unknown runtime {spec!r}; use one of: {RUNTIME_KINDS}")


def check_sources(tasks: Any, runtime: Any) -> None:
    """A ``local``/``subprocess`` runtime without a file needs every row to name its env file."""
    from ..runtimes import LocalRuntime, SubprocessRuntime

    if not isinstance(runtime, (LocalRuntime, SubprocessRuntime)) or getattr(runtime, "path", None):
        return
    for task in tasks:
        for row in (task, task.verifier):
            if row is not None and not (
                row.source and row.source.endswith(".py") and Path(row.source).is_file()
            ):
                raise ConfigError(
                    f"task {task.slug} names no env file (source={row.source!r}); "
                    f"use --runtime {runtime.kind}:ENV.py"
                )
