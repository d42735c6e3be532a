"""``LocalRuntime``: serve the environment inside the current process.

Each rollout gets an Environment of its own, served on a loopback port from a background task
of the running event loop (``local_own``: a path is loaded per rollout, a callable called per
rollout, a live object lent to one rollout at a time). With ``shared=True`` each Environment
object is served once and shared by the acquisitions that resolve to it (reference-counted; an
env file is imported once per process, so all its rollouts share one server, each in its own
session). A registry keyed by rollout id makes ``acquire`` and
``release`` idempotent. Endpoints only work in this process (locality ``process``). Imports
envserver lazily (only when something is served).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ConfigError, EnvError, ProviderError
from ..models import Endpoint, ProviderSpec, Task
from ..moved import import_path
from .base import DurableProvider, Locality
from .local_own import finish, serve_alone

__all__ = ["LocalRuntime"]


@dataclass
class _Served:
    url: str
    runner: asyncio.Task[None]
    stop: asyncio.Event
    loop: asyncio.AbstractEventLoop
    env_id: int
    keys: set[str] = field(default_factory=set)
    alone: bool = False  # one rollout's own server (local_own), not a shared one
    after: list[Callable[[], None]] = field(default_factory=list)  # once it has stopped

    def alive(self) -> bool:
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return self.loop is current and not self.runner.done()


_BY_KEY: dict[str, _Served] = {}
_SHARED: dict[int, _Served] = {}  # id(Environment) -> the one server of that object
_LOCKS: dict[tuple[int, int], asyncio.Lock] = {}
_INSTANCES: dict[str, LocalRuntime] = {}  # process-local handles for live-object runtimes


class LocalRuntime(DurableProvider):
    """Serve the environment in this process.

    Args:
        source: an ``env.py`` path (or ``module[:attr]``) used for rows whose ``source`` names
            no existing file; a live ``Environment``; or a callable ``task -> Environment``.
            None uses each task's ``source``. A file is loaded per rollout, a callable called
            per rollout, and a live Environment serves one rollout at a time.
        env_name: which environment of the file to serve (default: the task's ``env``).
        ready_timeout: seconds the environment may take to start.
        shared: serve each Environment once for all concurrent rollouts (initialize runs once;
            rollouts see each other's module state) instead of one per rollout.
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "local"
    locality: ClassVar[Locality] = "process"
    ephemeral: ClassVar[bool] = True  # served by this process's event loop
    honours: ClassVar[frozenset[str]] = frozenset({"limits.startup_timeout_s"})

    def __init__(self, source: Any = None, *, env_name: str | None = None,
                 ready_timeout: float = 60.0, shared: bool = False,
                 max_provisions_per_s: float | None = None, max_substrates: int | None = None) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        from ..envserver import Environment  # lazy: serving needs it, importing this does not
        from ..hud_detect import is_hud_environment

        self.env_name = env_name
        self.ready_timeout = ready_timeout
        self.shared = shared
        self.path: str | None = None
        self.live: Any = None
        self.factory: Callable[[Task], Any] | None = None
        self._handle: str | None = None
        if isinstance(source, Environment) or is_hud_environment(source):  # ours, or a HUD v6 one
            self.live = source
        elif isinstance(source, (str, Path)):
            self.path = _resolved(str(source))
        elif callable(source):
            self.factory = source
        elif source is not None:
            raise ConfigError(f"LocalRuntime source must be a path, an Environment or a callable, "
                              f"not {type(source).__name__}")

    def __repr__(self) -> str:
        what = self.path or (f"<Environment {self.live.name}>" if self.live is not None else self.factory)
        return f"LocalRuntime({what!r})"

    # -- spec -----------------------------------------------------------------------------

    def _portable_spec(self) -> ProviderSpec:
        if self.live is not None:
            raise ConfigError(
                "LocalRuntime(Environment object) cannot be sent to a worker: pass the path of "
                "the env file instead, e.g. LocalRuntime('env.py')"
            )
        options: dict[str, Any] = {"ready_timeout": self.ready_timeout}
        if self.shared:
            options["shared"] = True
        if self.env_name:
            options["env_name"] = self.env_name
        if self.factory is not None:
            qualname = getattr(self.factory, "__qualname__", "")
            module = getattr(self.factory, "__module__", "")
            if not qualname or "<" in qualname or not module:
                raise ConfigError("LocalRuntime(callable) needs a module-level function to reach "
                                  "a worker; pass the env file path instead")
            options["factory"] = f"{module}:{qualname}"
        elif self.path is not None:
            options["source"] = self.path
        return ProviderSpec(kind=self.kind, options=options)

    def spec(self) -> ProviderSpec:
        """The env file (or factory path) workers load; a process-local handle for a live
        Environment or a lambda: workers in this process use the object itself, workers
        elsewhere fail with one clear error (``from_options``)."""
        try:
            return self._portable_spec()
        except ConfigError:
            if self._handle is None:
                self._handle = uuid.uuid4().hex
                _INSTANCES[self._handle] = self
            return ProviderSpec(kind=self.kind, options={"instance": self._handle})

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> LocalRuntime:
        if "instance" in options:
            found = _INSTANCES.get(options["instance"])
            if found is None:
                raise ConfigError("this LocalRuntime serves a live Environment or a lambda that "
                                  "only exists in the process that started the batch, and this "
                                  "worker is elsewhere; pass the env file path instead")
            return found
        kw = {"env_name": options.get("env_name"), "ready_timeout": options.get("ready_timeout", 60.0),
              "shared": bool(options.get("shared", False))}
        if "factory" in options:
            module_name, _, qualname = str(options["factory"]).partition(":")
            try:
                obj: Any = import_path(module_name, qualname)
            except Exception as exc:
                raise ConfigError(f"cannot import LocalRuntime factory {options['factory']!r}: {exc}") from exc
            return cls(obj, **kw)
        return cls(options.get("source"), **kw)

    # -- lifecycle ------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        self.check_config(task.runtime_config, what=f"task {task.slug}")
        served = _BY_KEY.get(key)
        if served is None or not served.alive():
            if served is not None:  # its server died: give its environment back first
                finish(served)
            env = self.live if self.live is not None else await self._environment_for(task)
            timeout = self._ready_timeout(task)
            served = (await _share(env, timeout) if self.shared
                      else await serve_alone(env, lambda: _start(env, timeout, alone=True)))
            served.keys.add(key)
            _BY_KEY[key] = served
        # keep: only this process serves it, so each step may leave its connection open for the
        # rollout's next one (``sdk.kept``).
        return Endpoint(url=served.url, params={"keep": True}, config=task.runtime_config,
                        provider=self.spec(), key=key, handle={"pid": os.getpid()})

    async def release(self, endpoint: Endpoint) -> None:
        served = _BY_KEY.pop(endpoint.key, None)
        if served is None:
            return
        served.keys.discard(endpoint.key)
        if served.alone:
            await _stop(served)
            return
        if not served.alive():
            if _SHARED.get(served.env_id) is served:
                del _SHARED[served.env_id]
            return
        # Under the env's lock, so a new acquisition never meets a server that is stopping.
        async with _lock_for(served.env_id):
            if served.keys:
                return  # the environment still serves other rollouts
            if _SHARED.get(served.env_id) is served:
                del _SHARED[served.env_id]
            await _stop(served)

    # -- helpers --------------------------------------------------------------------------

    def _ready_timeout(self, task: Task) -> float:
        limits = task.runtime_config.limits if task.runtime_config is not None else None
        return (limits.startup_timeout_s if limits and limits.startup_timeout_s else self.ready_timeout)

    async def _environment_for(self, task: Task) -> Any:
        from ..envserver import Environment
        from ..envserver.environment import declared_source
        from ..envserver.loader import load_environment_async
        from ..hud_detect import is_hud_environment

        if self.factory is not None:
            env = self.factory(task)
            if inspect.isawaitable(env):
                env = await env
        else:
            has_file = bool(task.source and task.source.endswith(".py") and Path(task.source).is_file())
            target = task.source if has_file else (self.path or task.source
                                                   or declared_source(task.env))
            if not target:
                raise ConfigError(f"LocalRuntime has no source and task {task.slug} names none")
            try:
                env = await load_environment_async(  # off the loop
                    str(target), self.env_name or task.env, fresh=not self.shared)
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(f"cannot load environment {task.env!r} from {target}: {exc}") from exc
        if not (isinstance(env, Environment) or is_hud_environment(env)):
            raise ConfigError(f"LocalRuntime source gave {type(env).__name__}, not an Environment")
        return env


_RESOLVED: dict[str, str] = {}  # env file path -> its resolved path (a worker rebuilds the runtime per step)


def _resolved(source: str) -> str:
    """``source`` resolved when it exists (absolute ones cached: a worker rebuilds the runtime
    from its spec, which holds the resolved path, for every step)."""
    known = _RESOLVED.get(source)
    if known is None:
        if not Path(source).exists():
            return source
        known = str(Path(source).resolve())
        if os.path.isabs(source):
            _RESOLVED[source] = known
    return known


async def _share(env: Any, timeout: float) -> _Served:
    """The running server of ``env`` (one per Environment object: serving the same object
    twice would run its hooks twice and stop it under the other's feet)."""
    async with _lock_for(id(env)):
        served = _SHARED.get(id(env))
        if served is None or not served.alive():
            served = await _start(env, timeout)
            _SHARED[id(env)] = served
        return served


def _lock_for(env_id: int) -> asyncio.Lock:
    return _LOCKS.setdefault((env_id, id(asyncio.get_running_loop())), asyncio.Lock())


async def _stop(served: _Served) -> None:
    """Stop a server (its shutdown hooks run), then run its ``after`` callbacks."""
    if served.alive():
        served.stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(served.runner), 10.0)
        except (asyncio.TimeoutError, Exception):  # stop is best effort; never fail teardown
            served.runner.cancel()
    finish(served)


async def _start(env: Any, timeout: float, *, alone: bool = False) -> _Served:
    """Serve ``env`` from a background task until its stop event is set."""
    from ..capacity import in_process_limits
    from ..envserver import serving
    from ..envserver.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TASKS

    # it serves only this process's rollouts: as many as this process's widest worker holds
    max_tasks, max_connections = in_process_limits(DEFAULT_MAX_TASKS, DEFAULT_MAX_CONNECTIONS)
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()

    async def runner() -> None:
        try:
            async with serving(env, max_tasks=max_tasks, max_connections=max_connections) as server:
                ready.set_result(server.url)
                await stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(EnvError("serving was cancelled before it was ready"))
            raise
        except Exception as exc:
            # Before ready: acquire reports it. After: clients see a refused connection.
            if not ready.done():
                ready.set_exception(exc)

    task = loop.create_task(runner(), name=f"local-env-{getattr(env, 'name', '?')}")
    try:
        url = await asyncio.wait_for(asyncio.shield(ready), timeout)
    except asyncio.TimeoutError:
        stop.set()
        task.cancel()
        raise ProviderError(f"environment {getattr(env, 'name', '?')!r} did not start within {timeout}s") from None
    except asyncio.CancelledError:
        stop.set()
        task.cancel()
        raise
    except Exception as exc:
        raise EnvError(f"environment {getattr(env, 'name', '?')!r} failed to start: {exc}") from exc
    return _Served(url=url, runner=task, stop=stop, loop=loop, env_id=id(env), alone=alone)
