"""Any ``(task) -> async context manager yielding a Runtime`` as a provider (seed 001).

Seed 001: "a Provider is a structural protocol - no base class, no registry". An
``@asynccontextmanager`` function, a routing lambda over a dict of providers or of warm
``Runtime(url)``s: :func:`as_provider` wraps any such callable in :class:`CallableProvider`, the
durable face the steps use. Entering the callable's context manager is the provision step;
its exit runs in the teardown step, on the worker (process) that entered it, since the entered
context manager only exists there (``locality = "process"``).

The provider travels to workers as a spec: workers in this process use the object itself
(a process-local handle); workers elsewhere import it by ``module:qualname``. A lambda, a
closure or a function of ``__main__`` has no importable path; such a provider works with
in-process workers only, and elsewhere fails with one clear error. The substrates a plain
callable places are its own: gc does not sweep them.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any, ClassVar

from ..errors import ConfigError, ProviderError
from ..models import Endpoint, ProviderSpec, RuntimeConfig, Task
from ..moved import import_path
from .base import DurableProvider, Locality

__all__ = ["CallableProvider", "as_provider", "callable_path"]

_INSTANCES: dict[str, CallableProvider] = {}  # handle -> the provider, in the process that made it
_ENTERED: dict[str, tuple[Any, Endpoint]] = {}  # rollout key -> (entered context manager, endpoint)
_WRAPPED: dict[int, CallableProvider] = {}  # id(fn) -> its wrapper: one handle per callable


def callable_path(fn: Any) -> str | None:
    """``module:qualname`` that imports back to ``fn`` in another process, or None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is fn else None


class CallableProvider(DurableProvider):
    """The durable face of a plain provider callable.

    Args:
        fn: ``fn(task)`` returns an async context manager yielding a ``Runtime`` (or anything
            with a ``url`` and optional ``params``).
        path: ``module:qualname`` workers elsewhere import ``fn`` by (default: found from
            ``fn`` when it is a module-level name).
    """

    kind: ClassVar[str] = "callable"
    locality: ClassVar[Locality] = "process"  # the entered context manager lives here
    ephemeral: ClassVar[bool] = True  # and is gone with this process

    def __init__(self, fn: Any, *, path: str | None = None, handle: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"a provider must be callable as (task) -> async context manager, "
                              f"not {type(fn).__name__}")
        self.fn = fn
        self.path = path or callable_path(fn)
        self.handle = handle or uuid.uuid4().hex
        _INSTANCES.setdefault(self.handle, self)

    def __repr__(self) -> str:
        return f"CallableProvider({self.path or self.fn!r})"

    def check_config(self, config: RuntimeConfig | None, *, what: str = "task") -> None:
        return None  # what a row's runtime_config means is the callable's business

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {"handle": self.handle}
        if self.path:
            options["path"] = self.path
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> CallableProvider:
        found = _INSTANCES.get(str(options.get("handle")))
        if found is not None:
            return found
        path = options.get("path")
        if not path:
            raise ConfigError(
                "this provider is a lambda, a closure or a function of __main__: it only exists in "
                "the process that started the batch, and this worker is elsewhere; define it at "
                "module level in an importable module (module:attr)")
        module_name, _, qualname = str(path).partition(":")
        try:
            obj: Any = import_path(module_name, qualname)
        except Exception as exc:
            raise ConfigError(f"cannot import provider {path!r} on this worker: "
                              f"{type(exc).__name__}: {exc}") from exc
        return cls(obj, path=str(path), handle=str(options.get("handle")))

    async def acquire(self, task: Task, key: str) -> Endpoint:
        entered = _ENTERED.get(key)
        if entered is not None:
            return entered[1]
        manager = self.fn(task)
        if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
            raise ConfigError(f"provider {self!r} returned {type(manager).__name__}, not an async "
                              "context manager (write it with @asynccontextmanager)")
        runtime = await manager.__aenter__()
        url = getattr(runtime, "url", None)
        if not isinstance(url, str):
            await manager.__aexit__(None, None, None)
            raise ProviderError(f"provider {self!r} yielded {type(runtime).__name__}, not a Runtime "
                                "with a url")
        config = getattr(runtime, "config", None)
        endpoint = Endpoint(url=url, params=dict(getattr(runtime, "params", None) or {}),
                            config=config if isinstance(config, RuntimeConfig) else task.runtime_config,
                            provider=self.spec(), key=key, handle={"pid": os.getpid()})
        _ENTERED[key] = (manager, endpoint)
        return endpoint

    async def release(self, endpoint: Endpoint) -> None:
        entered = _ENTERED.pop(endpoint.key, None)
        if entered is not None:
            await entered[0].__aexit__(None, None, None)


def as_provider(runtime: Any) -> DurableProvider:
    """``runtime`` as a durable provider: a built-in as is, any other callable wrapped.

    Raises:
        ConfigError: ``runtime`` is not callable.
    """
    if isinstance(runtime, DurableProvider):
        return runtime
    if callable(runtime):
        wrapped = _WRAPPED.get(id(runtime))
        if wrapped is None or wrapped.fn is not runtime:
            wrapped = _WRAPPED[id(runtime)] = CallableProvider(runtime)
        return wrapped
    raise ConfigError(f"runtime must be a provider: a Runtime, LocalRuntime(...), ... or any "
                      f"(task) -> async context manager yielding a Runtime; not "
                      f"{type(runtime).__name__}")
