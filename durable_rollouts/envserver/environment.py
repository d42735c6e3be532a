"""Environment authoring: ``Environment``, task templates, hooks, ``Answer`` and ``Capability``.

An :class:`Environment` is only a declaration: templates (async generators), lifecycle hooks and
capabilities. Serving it is ``server.py``'s job; driving one task is ``runner.py``'s. This module
also owns the two pure conversions the server needs: binding/coercing arguments against a
template's signature and normalising whatever the second ``yield`` produced into a score frame.

Imports only pydantic, ``durable_rollouts.errors`` and ``durable_rollouts.models`` (the capability
modules ``workspace``/``mcp`` load lazily from ``env.workspace()``/``env.mcp()``); never the server,
the client or anything under ``sdk``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import math
import sys
import typing
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, create_model

from ..errors import ConfigError, EnvError, TaskNotFoundError
from ..models import Task
from .arguments import _adapter, _coerce, _LenientSchema, _parse_answer, _schema
from .capability import Capability

if typing.TYPE_CHECKING:
    from .mcp import McpService
    from .workspace import Workspace

__all__ = [
    "Answer",
    "Capability",
    "Environment",
    "Template",
    "declared_source",
    "normalize_grade",
]

log = logging.getLogger(__name__)

SERVER = "durable_rollouts.envserver.server"  # its serve() runs Environment.serve

T = TypeVar("T")

Hook = Callable[[], Any]


class Answer(BaseModel, Generic[T]):
    """What a template declared with ``returns=T`` receives: the parsed answer plus the raw text.

    ``content`` is the answer validated as ``T``; when that fails it is the raw value unchanged.
    """

    content: T
    raw: str


class Template:
    """One registered task template: an async-generator function plus its metadata."""

    def __init__(
        self,
        env: Environment,
        fn: Callable[..., AsyncGenerator[Any, Any]],
        *,
        id: str,
        description: str,
        returns: Any,
        input: Any = None,
    ) -> None:
        self.env = env
        self.fn = fn
        self.id = id
        self.description = description or (inspect.getdoc(fn) or "").strip()
        self.returns = returns
        self.input = input
        self.signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # unresolvable forward refs: fall back to Any for those
            hints = {}
        self._hints = hints
        self._adapters: dict[str, TypeAdapter[Any]] = {}
        self.var_kwargs = False
        for name, param in self.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                self.var_kwargs = True
                continue
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            self._adapters[name] = _adapter(hints.get(name, Any))
        self._answer_adapter: TypeAdapter[Any] | None = (
            _adapter(returns) if returns is not None else None  # shared when plain (list[str])
        )

    # -- calling a template builds a Task row ------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Task:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for name, param in self.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                values.update(values.pop(name, {}))
        return Task(env=self.env.name, id=self.id, args=values, source=self.env.source)

    # -- wire-facing helpers -------------------------------------------------------------------

    def bind_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validate and coerce wire arguments; raises ``ConfigError`` on any mismatch.

        Each value is validated against its annotation; a string that fails is JSON-decoded and
        validated again. Unknown names fail unless the template takes ``**kwargs``.
        """
        unknown = sorted(set(args) - set(self._adapters))
        if unknown and not self.var_kwargs:
            raise ConfigError(f"task {self.id!r} got unknown argument(s): {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for name, value in args.items():
            adapter = self._adapters.get(name)
            out[name] = value if adapter is None else _coerce(adapter, name, value)
        missing = [
            name
            for name, p in self.signature.parameters.items()
            if name in self._adapters and p.default is inspect.Parameter.empty and name not in out
        ]
        if missing:
            raise ConfigError(f"task {self.id!r} is missing argument(s): {', '.join(missing)}")
        return out

    def make_generator(self, args: dict[str, Any]) -> AsyncGenerator[Any, Any]:
        """Bind coerced ``args`` (see :meth:`bind_arguments`) and create the generator."""
        return self.fn(**args)

    def wrap_answer(self, answer: Any) -> Any:
        """The value sent into the generator: raw answer, or ``Answer[T]`` with ``returns=T``."""
        if self._answer_adapter is None:
            return answer
        raw = answer if isinstance(answer, str) else json.dumps(answer, default=str)
        content = _parse_answer(self._answer_adapter, answer)
        return Answer[self.returns].model_construct(content=content, raw=raw)  # type: ignore[name-defined]

    def manifest(self) -> dict[str, Any]:
        """The ``tasks.list`` entry, shaped as HUD v6 shapes it: ``id``, ``description``,
        ``args`` (the JSON schema of the parameters, each with its title), then ``input`` and
        ``returns`` schemas only when the template declares them."""
        entry: dict[str, Any] = {"id": self.id, "description": self.description, "args": self._args_schema()}
        for key, declared in (("input", self.input), ("returns", self.returns)):
            if declared is not None:
                entry[key] = _schema(TypeAdapter(declared))
        return entry

    def _args_schema(self) -> dict[str, Any]:
        """The parameters as one object schema (a pydantic model of them, its title dropped)."""
        fields: dict[str, Any] = {}
        for name, adapter in self._adapters.items():
            default = self.signature.parameters[name].default
            required = default is inspect.Parameter.empty
            fields[name] = (self._hints.get(name, Any), ... if required else default)
        try:
            model = create_model("TaskArgs", __config__=ConfigDict(arbitrary_types_allowed=True), **fields)
            schema = model.model_json_schema(schema_generator=_LenientSchema)
        except Exception:  # a type or default pydantic cannot describe: the task still works
            schema = {"properties": {name: {"title": name.replace("_", " ").title()} for name in fields},
                      "type": "object"}
        schema.pop("title", None)
        schema["additionalProperties"] = self.var_kwargs
        return schema


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def normalize_grade(value: Any) -> dict[str, Any]:
    """Turn the second ``yield`` into a score frame; raises ``TypeError`` for anything else.

    A number becomes ``{"score": x}``; a dict must carry a numeric (non-bool) ``score`` and passes
    through with its other keys; an object with a numeric ``.reward`` is dumped in full with
    ``reward`` renamed to ``score``.
    """
    if _is_number(value):
        return {"score": float(value)}
    if isinstance(value, dict):
        if not _is_number(value.get("score")):
            raise TypeError(f"a grade dict needs a numeric 'score', got {value.get('score')!r}")
        return {**value, "score": float(value["score"])}
    reward = getattr(value, "reward", None)
    if _is_number(reward):
        if isinstance(value, BaseModel):
            data = value.model_dump(mode="json")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            data = dataclasses.asdict(value)
        else:
            data = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        data.pop("reward", None)
        return {"score": float(reward), **data}
    raise TypeError(f"a grade must be a number, a dict with 'score' or have .reward; got {value!r}")


class Environment:
    """Declares an environment: task templates, lifecycle hooks and capabilities.

    Example::

        env = Environment(name="letters", version="1.0.0")

        @env.template()
        async def count_letter(word: str = "strawberry", letter: str = "r"):
            answer = yield f"How many '{letter}' in '{word}'?"
            yield 1.0 if str(word.count(letter)) in (answer or "") else 0.0
    """

    def __init__(self, name: str = "environment", *, version: str = "0.0.1",
                 capabilities: typing.Sequence[Capability] | None = None) -> None:
        self.name = name
        self.version = version
        self.templates: dict[str, Template] = {}
        self._initialize: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._capabilities: dict[str, Capability] = {}
        self.started = False
        self.source = _caller_file()
        for capability in capabilities or ():  # published from the start (HUD's capabilities=)
            self.add_capability(capability)
        if self.source is not None:
            _DECLARED[name] = self.source

    # -- declarations --------------------------------------------------------------------------

    def template(
        self,
        fn: Callable[..., AsyncGenerator[Any, Any]] | None = None,
        /,
        *,
        id: str | None = None,
        description: str = "",
        input: Any = None,
        returns: Any = None,
    ) -> Any:
        """Register an async-generator function as a task template (``@env.template()`` or bare).

        Args:
            id: the task id (default: the function name).
            description: shown by ``tasks.list`` (default: the docstring).
            input: the type(s) the agent is given (a pydantic model or a union of them); published
                as a JSON schema in ``tasks.list`` (as HUD v6 does), nothing else changes.
            returns: a type or pydantic model; the answer then arrives as ``Answer[returns]``.

        Raises:
            TypeError: the function is not an async generator.
            ValueError: a template with this id already exists.
        """

        def register(func: Callable[..., AsyncGenerator[Any, Any]]) -> Template:
            if not inspect.isasyncgenfunction(func):
                raise TypeError(f"template {getattr(func, '__name__', func)!r} must be an async generator function")
            task_id = id or func.__name__
            if task_id in self.templates:
                raise ValueError(f"duplicate task template id {task_id!r}")
            tpl = Template(self, func, id=task_id, description=description, returns=returns, input=input)
            self.templates[task_id] = tpl
            return tpl

        return register if fn is None else register(fn)

    def get_template(self, id: str) -> Template:
        """The template with this id; ``TaskNotFoundError`` when there is none."""
        try:
            return self.templates[id]
        except KeyError:
            raise TaskNotFoundError(f"unknown task {id!r} (known: {', '.join(sorted(self.templates))})") from None

    def initialize(self, fn: Hook) -> Hook:
        """Register a hook run (in order) by :meth:`start`, before the server accepts clients."""
        self._initialize.append(fn)
        return fn

    def shutdown(self, fn: Hook) -> Hook:
        """Register a hook run (in reverse order, best effort) by :meth:`stop`."""
        self._shutdown.append(fn)
        return fn

    def add_capability(self, capability: Capability) -> None:
        """Publish a capability (replacing one with the same name)."""
        if not capability.url:
            raise ValueError(f"capability {capability.name!r} has no url")
        if self.started:
            log.warning("capability %r added after the environment started", capability.name)
        self._capabilities[capability.name] = capability

    def capability(self, name: str) -> Capability:
        """The capability with this name (``KeyError`` when missing)."""
        return self._capabilities[name]

    @property
    def capabilities(self) -> list[Capability]:
        return list(self._capabilities.values())

    def workspace(self, root: str | Path | None = None, *, name: str = "shell",
                  **kwargs: Any) -> Workspace:
        """Publish a sandboxed ssh workspace (``ssh/2``), started when the environment serves.

        See :class:`~durable_rollouts.envserver.workspace.Workspace` for ``network``, ``mounts``,
        ``timeout_s``, ``isolation`` ...; returns it (its ``root`` is concrete once serving).
        """
        from .workspace import add_workspace  # lazy: asyncssh loads only when a workspace is used

        return add_workspace(self, root, name=name, **kwargs)

    def mcp(self, server: Any, *, name: str = "tools", **kwargs: Any) -> McpService:
        """Publish a fastmcp server's tools (or an MCP http url) as an ``mcp`` capability."""
        from .mcp import add_mcp  # lazy: fastmcp loads only when an mcp capability is used

        return add_mcp(self, server, name=name, **kwargs)

    # -- lifecycle -----------------------------------------------------------------------------

    async def serve(self, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        """Serve this environment until cancelled (HUD's ``env.serve()``); prints
        ``ROLLOUTS_SERVE_PORT=<port>`` once it accepts. Options as ``envserver.serve``."""
        # The server builds on this module, so it is looked up by name when serving starts (as
        # Taskset.run finds the Temporal layer): declaring an environment loads no server.
        serve = importlib.import_module(SERVER).serve
        await serve(self, host, port, **options)

    async def start(self) -> None:
        """Run the initialize hooks once; a failing hook raises ``EnvError`` naming it."""
        if self.started:
            return
        for hook in self._initialize:
            try:
                await _call_hook(hook)
            except Exception as exc:
                # Undo what earlier hooks started (a workspace daemon, an MCP server): nothing is
                # left running when serve fails. Shutdown hooks are best effort, so this is safe.
                await self.stop()
                raise EnvError(f"initialize hook {_hook_name(hook)} failed: {exc!r}") from exc
        self.started = True

    async def stop(self) -> None:
        """Run the shutdown hooks in reverse order; errors are logged, never raised.

        A hook that awaits a task it has just cancelled ends in CancelledError (the seeds' MCP
        example does: ``suppress(Exception)`` does not catch it). Unless whoever called ``stop``
        is itself being cancelled, that is the hook's own failure: logged like any other.
        """
        for hook in reversed(self._shutdown):
            try:
                await _call_hook(hook)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is None or current.cancelling():
                    raise  # our caller is being cancelled: honour it
                log.warning("shutdown hook %s ended in CancelledError (it awaited a task it "
                            "cancelled?); the other hooks still run", _hook_name(hook))
            except Exception:
                log.exception("shutdown hook %s failed", _hook_name(hook))
        self.started = False


_DECLARED: dict[str, str] = {}  # env name -> the .py file that last declared an Environment of it


def declared_source(name: str) -> str | None:
    """The file that declared an Environment called ``name`` in this process, if any (seed 001's
    default placement serves rows that name no file from their env's declaring file)."""
    return _DECLARED.get(name)


async def _call_hook(hook: Hook) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result


def _hook_name(hook: Hook) -> str:
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", repr(hook))


def _caller_file() -> str | None:
    # The file that constructed the Environment is its natural `source` for Task rows.
    frame = sys._getframe(2)
    path = frame.f_globals.get("__file__")
    if isinstance(path, str) and path.endswith(".py"):
        return str(Path(path).resolve())
    return None
