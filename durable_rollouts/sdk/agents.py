"""Agents: the ``Agent`` base class, the built-in test agents, and loading agents from specs.

An agent reaches a worker as data (``AgentSpec``: ``module:QualName`` or a built-in short name,
plus its pydantic config, or the arguments of a HUD-style ``__init__``) and is rebuilt there by
:func:`load_agent`. A HUD v6 agent (a subclass
of ``hud.agents.base.Agent``) travels the same way, as its own class path plus ``dump()``, and runs
through :class:`HudAgent`; :func:`as_agent` accepts either kind of agent object. Imports models,
errors, hud_detect, run and the HUD adapter only; never envserver, providers or Temporal.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from ..errors import ConfigError
from ..hud_detect import is_hud_agent_class, missing_hud
from ..models import AgentSpec
from ..moved import import_module as import_moved
from .hud_compat import run_hud_agent

if TYPE_CHECKING:
    from .run import Run

__all__ = [
    "BUILTIN_AGENTS",
    "Agent",
    "FailAgent",
    "FixedAgent",
    "HudAgent",
    "SleepAgent",
    "TableAgent",
    "as_agent",
    "check_remote",
    "load_agent",
    "resolve_class",
]


class Agent(BaseModel, ABC):
    """Base class of agents: drive ``run`` and put the final answer in ``run.trace.content``.

    Two ways to write one. Declare settings as pydantic fields (they are the config that travels
    to workers), or, as HUD writes agents, give the class its own ``__init__`` that sets plain
    attributes (``self.model = model``; no ``super().__init__()`` needed): such an agent travels
    as its class path plus the arguments its ``__init__`` was called with, which must be JSON
    data, and workers rebuild it by calling the class with them.

    Example::

        class MyAgent(Agent):
            def __init__(self, model: str = "gpt-4o") -> None:
                self.model = model

            async def __call__(self, run: Run) -> None:
                run.trace.content = "3"
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    short_name: ClassVar[str | None] = None
    """Set by built-in agents: the name a spec may use instead of an import path."""

    _own_init: ClassVar[bool] = False
    """True for a class (or the subclass of one) that defines its own ``__init__`` (HUD style)."""

    timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock limit of one agent step; on expiry the trace stops with ``timeout``."""

    _init_args: dict[str, Any] | None = PrivateAttr(default=None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls._own_init = True
            cls.__init__ = _wrap_own_init(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def __init__(self, /, **data: Any) -> None:
        if not _set_up(self):
            super().__init__(**data)
        elif data:  # a HUD-style __init__ calling super().__init__(timeout_s=...): set, validated
            probe = BaseModel.__new__(type(self))
            BaseModel.__init__(probe, **data)
            for name in data:
                setattr(self, name, getattr(probe, name))

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]  # no custom-init path

    def __setattr__(self, name: str, value: Any) -> None:
        if type(self)._own_init and name not in type(self).model_fields and not name.startswith("_"):
            object.__setattr__(self, name, value)  # a HUD-style attribute, kept outside the fields
        else:
            super().__setattr__(name, value)

    @abstractmethod
    async def __call__(self, run: Run) -> None:
        """Work on ``run``; set ``run.trace.content`` to the final answer."""

    def spec(self) -> AgentSpec:
        """This agent as data: its import path (or short name) plus its config (its fields, or
        the arguments of its own ``__init__``)."""
        cls = type(self)
        config = self._init_config() if cls._own_init else self.model_dump(mode="json", exclude_defaults=True)
        if cls.short_name and BUILTIN_AGENTS.get(cls.short_name) is cls:
            return AgentSpec(path=cls.short_name, config=config)
        if "<locals>" in cls.__qualname__:
            raise ConfigError(
                f"agent class {cls.__qualname__} is defined inside a function; workers cannot "
                "import it. Define it at module level."
            )
        # A class from __main__ works with the embedded worker (same process); a remote worker
        # cannot import it and load_agent says so there.
        return AgentSpec(path=f"{cls.__module__}:{cls.__qualname__}", config=config)

    def _init_config(self) -> dict[str, Any]:
        """The keyword arguments this HUD-style agent was built with (ConfigError if they cannot
        travel: positional extras, or values that are not JSON data)."""
        args = self._init_args or {}
        name = type(self).__qualname__
        if _VARARGS in args:
            raise ConfigError(f"agent {name} was built with extra positional arguments (*args); "
                              "workers rebuild it from keyword arguments only")
        for key, value in args.items():
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"agent {name} was built with {key}={type(value).__name__}, which is not JSON "
                    "data; workers rebuild the agent by calling its class with its __init__ "
                    "arguments, so pass plain data (a model name, a dict) and build clients "
                    "inside the agent") from None
        return dict(args)


_VARARGS = "*args"


def _set_up(agent: BaseModel) -> bool:
    """Whether pydantic's state of ``agent`` is in place (BaseModel.__init__ ran)."""
    try:
        object.__getattribute__(agent, "__pydantic_fields_set__")
    except AttributeError:
        return False
    return True


def _wrap_own_init(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a subclass's own ``__init__``: pydantic's state first (fields at their defaults), the
    call's arguments recorded (by the outermost ``__init__`` only), then the user's code."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Agent, *args: Any, **kwargs: Any) -> None:
        if not _set_up(self):
            BaseModel.__init__(self)
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # the call below raises the usual TypeError
            if bound is not None:
                self._init_args = _keywords(bound)
        init(self, *args, **kwargs)

    return __init__


def _keywords(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The explicitly passed arguments of ``bound`` (without ``self``) as keywords."""
    out: dict[str, Any] = {}
    params = bound.signature.parameters
    for position, (name, value) in enumerate(bound.arguments.items()):
        if position == 0:
            continue  # self
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                out[_VARARGS] = list(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


class FixedAgent(Agent):
    """Answers every task with ``answer``."""

    short_name: ClassVar[str | None] = "fixed"
    answer: str = ""

    async def __call__(self, run: Run) -> None:
        run.trace.content = self.answer


class TableAgent(Agent):
    """Looks the answer up by task slug, then task id; ``default`` otherwise."""

    short_name: ClassVar[str | None] = "table"
    answers: dict[str, str] = Field(default_factory=dict)
    default: str | None = None

    async def __call__(self, run: Run) -> None:
        keys = [run.slug] + ([run.task.id] if run.task is not None else [])
        for key in keys:
            if key in self.answers:
                run.trace.content = self.answers[key]
                return
        run.trace.content = self.default


class SleepAgent(Agent):
    """Sleeps ``seconds`` (cancellable), then answers ``answer``."""

    short_name: ClassVar[str | None] = "sleep"
    seconds: float = Field(default=1.0, ge=0)
    answer: str = ""

    async def __call__(self, run: Run) -> None:
        await asyncio.sleep(self.seconds)
        run.trace.content = self.answer


class FailAgent(Agent):
    """Raises ``RuntimeError(message)``: for testing error paths."""

    short_name: ClassVar[str | None] = "fail"
    message: str = "agent failed on purpose"

    async def __call__(self, run: Run) -> None:
        raise RuntimeError(self.message)


BUILTIN_AGENTS: dict[str, type[Agent]] = {
    "fixed": FixedAgent,
    "table": TableAgent,
    "sleep": SleepAgent,
    "fail": FailAgent,
}


def resolve_class(path: str) -> type:
    """The class named by ``module:QualName`` (ConfigError with the reason when it is not one)."""
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise ConfigError(
            f"agent {path!r} is neither a built-in ({', '.join(sorted(BUILTIN_AGENTS))}) "
            "nor an import path 'module:Class'"
        )
    module = sys.modules.get(module_name)
    if module is None:
        if module_name == "__main__":
            raise ConfigError(f"agent {path!r} lives in __main__, which this process cannot import")
        try:
            module = import_moved(module_name)
        except Exception as exc:  # an ImportError or anything the module raises on import
            raise missing_hud(exc, f"agent module {module_name!r}") or ConfigError(
                f"cannot import agent module {module_name!r}: {exc}") from exc
    obj: object = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hint = (" (a class defined in a script's __main__ cannot reach other processes: "
                    "move it to an importable module)") if module_name == "__main__" else ""
            raise ConfigError(f"agent {path!r}: {module_name} has no attribute {qualname!r}{hint}") from None
    if not isinstance(obj, type):
        raise ConfigError(f"agent {path!r} is not a class")
    return obj


def check_remote(spec: AgentSpec) -> None:
    """Raise ConfigError when ``spec`` can only be loaded in the process that made it.

    Call this before sending an agent to workers in other processes: a class defined in a
    script (``__main__``) is importable only by the embedded worker of that same script.
    """
    if spec.path.startswith("__main__:"):
        raise ConfigError(
            f"agent class {spec.path.split(':', 1)[1]} is defined in the script being run "
            "(__main__), so workers in other processes cannot import it; move it to a module "
            "on their PYTHONPATH (e.g. agents.py) or use the embedded worker"
        )


def load_agent(spec: AgentSpec | str) -> Agent:
    """Rebuild an agent from its spec (a built-in short name or ``module:Class`` plus config).

    Raises:
        ConfigError: the path cannot be imported, is not an Agent, or the config is invalid.
    """
    if isinstance(spec, str):
        spec = AgentSpec(path=spec)
    cls = BUILTIN_AGENTS.get(spec.path) or resolve_class(spec.path)
    if is_hud_agent_class(cls):
        agent = HudAgent(agent=spec.path, config=spec.config)
        agent.timeout_s = getattr(agent.hud_instance().config, "timeout_seconds", None)  # config checked now
        return agent
    if not issubclass(cls, Agent):
        raise ConfigError(f"agent {spec.path!r} is not a durable_rollouts Agent subclass")
    try:
        return cls(**spec.config) if cls._own_init else cls.model_validate(spec.config)
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"invalid config for agent {spec.path!r}: {exc}") from exc


class HudAgent(Agent):
    """A HUD v6 agent (a subclass of ``hud.agents.base.Agent``) as a rollout's agent.

    Build it with :func:`as_agent` (``run_direct``, ``Taskset.run`` and ``--agent file.py:Class``
    do). ``agent`` is the HUD agent's ``module:Class`` and ``config`` its ``dump()``; the spec sent
    to workers is exactly that pair (rebuilt there with the class's ``load``), so the Web UI and
    exports name the user's class. Its ``config.timeout_seconds`` is the agent step's timeout.
    """

    agent: str
    config: dict[str, Any] = Field(default_factory=dict)
    _built: Any = PrivateAttr(default=None)

    def spec(self) -> AgentSpec:
        return AgentSpec(path=self.agent, config=self.config)

    def hud_instance(self) -> Any:
        """The HUD agent object (built from ``agent`` and ``config`` on first use)."""
        if self._built is None:
            cls = resolve_class(self.agent)
            try:
                self._built = cls.load(self.config)  # type: ignore[attr-defined]
            except Exception as exc:  # its config class's ValidationError, mostly
                raise ConfigError(f"invalid config for HUD agent {self.agent!r}: {exc}") from exc
        return self._built

    async def __call__(self, run: Run) -> None:
        await run_hud_agent(self.hud_instance(), run)


def as_agent(agent: Any) -> Agent:
    """``agent`` as one of ours: an :class:`Agent` as is; a HUD v6 agent (instance or class)
    wrapped in :class:`HudAgent`; anything else is a ConfigError."""
    if isinstance(agent, Agent):
        return agent
    cls = agent if isinstance(agent, type) else type(agent)
    if not is_hud_agent_class(cls):
        raise ConfigError(f"agent must be a durable_rollouts Agent or a HUD agent, not {cls.__name__}")
    if "<locals>" in cls.__qualname__:
        raise ConfigError(f"HUD agent class {cls.__qualname__} is defined inside a function; workers "
                          "cannot import it. Define it at module level.")
    built = cls() if isinstance(agent, type) else agent
    wrapper = HudAgent(agent=f"{cls.__module__}:{cls.__qualname__}", config=built.dump(),
                       timeout_s=getattr(built.config, "timeout_seconds", None))
    wrapper._built = built
    return wrapper

