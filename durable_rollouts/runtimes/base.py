"""The provider contract shared by every runtime, plus helpers all providers use.

A provider places a task's environment somewhere and says where it answers. Two faces:

* the durable face used by the step functions: ``spec()`` (the provider as data, rebuilt on each
  worker), ``acquire(task, key) -> Endpoint`` and ``release(endpoint)``, both idempotent by key
  (the rollout id), and ``locality`` (``process``, ``host`` or ``global``: where later steps may
  run);
* the DESIGN.md face: ``provider(task)`` is an async context manager yielding a ``Runtime``.

Providers also reject ``RuntimeConfig`` fields they cannot honour (``check_config``), and each
provider that leaves something running lists and reaps its own substrates for gc
(``list_substrates()`` -> ``Substrate``s, ``reap(substrate, confirm)``), so gc never knows a
provider's internals. This module imports models and errors only; each provider lives in its own
module; helpers two providers share (``container_name``, ``merge_config``, ``as_config`` ...)
live here.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..admission import Admission, admission_of
from ..client.tokens import TOKEN_FROM, endpoint_token, token_rejected
from ..errors import ConfigError, ProviderError, ReadyTimeoutError, UnauthorizedError
from ..models import Endpoint, ProviderSpec, RuntimeConfig, Task
from ..paths import safe_name

__all__ = ["DurableProvider", "Locality", "Runtime", "Substrate", "as_config", "config_options",
           "container_name", "log_tail", "merge_config"]

Locality = Literal["process", "host", "global"]


@dataclass
class Substrate:
    """One substrate a provider placed and still sees on this host (a gc candidate).

    ``kind`` is the provider's ``kind``; ``labels`` the owner labels (``sdk.labels``); ``handle``
    what the provider needs to remove it; ``alive``/``owner_gone``/``dead`` what gc judges it by
    (``dead``: why it can never serve again, e.g. ``process already dead``; '' when it could).
    """

    kind: str
    labels: dict[str, str]
    handle: dict[str, Any]
    alive: bool
    owner_gone: bool = False
    dead: str = ""


def container_name(key: str) -> str:
    """A valid, collision-free container/sandbox name for a rollout key."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return f"rollouts-{safe_name(key)[:80]}-{digest}"


def as_config(value: RuntimeConfig | dict[str, Any] | None) -> RuntimeConfig | None:
    """A provider's ``runtime_config=`` argument (a model, its dict, or None) as a model."""
    return RuntimeConfig.model_validate(value) if isinstance(value, dict) else value


def config_options(config: RuntimeConfig | None) -> dict[str, Any]:
    """``{"runtime_config": ...}`` for a provider spec's options ({} without a config)."""
    if config is None:
        return {}
    return {"runtime_config": config.model_dump(mode="json", exclude_none=True)}


def merge_config(base: RuntimeConfig | None, override: RuntimeConfig | None) -> RuntimeConfig:
    """``override``'s set fields on top of ``base``'s (field by field inside resources/limits)."""
    merged = (base or RuntimeConfig()).model_dump(exclude_none=True)
    for name, value in (override or RuntimeConfig()).model_dump(exclude_none=True).items():
        if isinstance(value, dict):
            merged.setdefault(name, {}).update(value)
        else:
            merged[name] = value
    return RuntimeConfig.model_validate(merged)


class DurableProvider(ABC):
    """Base class of built-in providers."""

    kind: ClassVar[str] = ""
    """The built-in name used in ``ProviderSpec.kind``."""

    locality: ClassVar[Locality] = "global"
    """Where an endpoint can be reached from: this process, this host, or anywhere."""

    ephemeral: ClassVar[bool] = False
    """True when a substrate lives inside the process that provisioned it and dies with it."""

    honours: ClassVar[frozenset[str]] = frozenset()
    """Dotted ``RuntimeConfig`` fields this provider can honour; any other set field is rejected."""

    admission: Admission | None = None
    """Fleet-wide admission (``max_provisions_per_s``, ``max_substrates``), held by Temporal
    across every worker of the task queue (``durable_rollouts.admission``); None: unlimited."""

    def admit(self, max_provisions_per_s: float | None, max_substrates: int | None) -> None:
        """Set this runtime's admission limits (every built-in runtime's two keyword options).

        Raises:
            ConfigError: a rate that is not above 0, or a ceiling below 1.
        """
        self.admission = admission_of(max_provisions_per_s, max_substrates)

    @abstractmethod
    def spec(self) -> ProviderSpec:
        """This provider as data (raises ConfigError when it cannot be sent to a worker)."""

    @abstractmethod
    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Place ``task``'s environment (or find the one already placed under ``key``)."""

    @abstractmethod
    async def release(self, endpoint: Endpoint) -> None:
        """Remove what ``acquire`` placed; a no-op when it is already gone."""

    def check_config(self, config: RuntimeConfig | None, *, what: str = "task") -> None:
        """Raise ConfigError naming every set ``RuntimeConfig`` field this provider ignores."""
        if config is None:
            return
        unsupported = sorted(config.set_fields() - self.honours)
        if unsupported:
            honoured = ", ".join(sorted(self.honours)) or "none"
            raise ConfigError(
                f"{type(self).__name__} cannot honour runtime_config field(s) "
                f"{', '.join(unsupported)} of {what} (it honours: {honoured})"
            )

    def check_task(self, task: Task) -> None:
        """Check a row and its verifier before anything starts."""
        self.check_config(task.runtime_config, what=f"task {task.slug}")
        if task.verifier is not None:
            self.check_config(task.verifier.runtime_config, what=f"verifier of {task.slug}")

    def __call__(self, task: Task) -> Any:
        """The DESIGN.md provider face: ``async with provider(task) as runtime``."""
        return _provide(self, task)

    # -- gc: the substrates this kind of provider left on this host ------------------------

    @classmethod
    def list_substrates(cls) -> list[Substrate]:
        """Every substrate of this kind on this host (labelled with ``sdk.labels``)."""
        return []

    @classmethod
    async def reap(cls, substrate: Substrate, confirm: Callable[[], Awaitable[bool]]) -> bool:
        """Remove ``substrate`` if ``confirm()`` (asked at the last moment, under whatever lock
        the provider keeps) still says it is an orphan; True when it was removed."""
        return False


@asynccontextmanager
async def _provide(provider: DurableProvider, task: Task) -> AsyncIterator[Runtime]:
    endpoint = await provider.acquire(task, f"adhoc-{uuid.uuid4().hex[:12]}")
    params = {k: v for k, v in endpoint.params.items() if k != TOKEN_FROM}
    token = endpoint_token(endpoint)  # in-process only: a Runtime carries its token
    if token is not None:
        params["token"] = token
    try:
        yield Runtime(endpoint.url, params, endpoint.config)
    finally:
        await provider.release(endpoint)


@dataclass(frozen=True)
class Runtime(DurableProvider):
    """A borrowed, already running server: where it answers, and nothing to manage.

    ``Runtime(url)`` is its own provider: acquiring it returns its url, releasing it does nothing.

    Args:
        url: ``tcp://host:port`` of the control channel.
        params: extra connection parameters (``token``, ``ready_timeout``). A borrowed server's
            token travels in the provider spec (so in workflow history, unless
            ``ROLLOUTS_PAYLOAD_KEY`` is set); built-in providers derive theirs instead.
        config: the RuntimeConfig it was placed with, if any (informational).
    """

    url: str
    params: dict[str, Any] = field(default_factory=dict)
    config: RuntimeConfig | None = None

    kind: ClassVar[str] = "runtime"
    locality: ClassVar[Locality] = "global"

    def __hash__(self) -> int:
        return hash(self.url)

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {"url": self.url, "params": dict(self.params)}
        if self.config is not None:
            options["config"] = self.config.model_dump(mode="json", exclude_none=True)
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Runtime:
        config = options.get("config")
        return cls(options["url"], dict(options.get("params") or {}),
                   RuntimeConfig.model_validate(config) if config else None)

    async def acquire(self, task: Task, key: str) -> Endpoint:
        return Endpoint(url=self.url, params=dict(self.params), config=self.config or task.runtime_config,
                        provider=self.spec(), key=key)

    async def release(self, endpoint: Endpoint) -> None:
        return None  # borrowed: someone else owns its lifecycle

    def __call__(self, task: Task) -> Any:
        return _borrowed(self)


@asynccontextmanager
async def _borrowed(runtime: Runtime) -> AsyncIterator[Runtime]:
    yield runtime


def log_tail(path: str | Path, lines: int = 50) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


CONTAINER_FIELDS: frozenset[str] = frozenset(
    {
        "image",
        "resources.cpu",
        "resources.memory_mb",
        "resources.gpu",
        "limits.startup_timeout_s",
        "limits.run_timeout_s",
    }
)
"""RuntimeConfig fields a container-like substrate (Docker, Modal) can honour.

A GPU *type* (``resources.gpu.type``) is not among them: Docker hands out GPUs by count only;
Modal adds it to its own set."""


async def probe_ready(
    url: str,
    token: str | None,
    timeout: float,
    *,
    died: Callable[[], Awaitable[str | None]] | None = None,
    timed_out: Callable[[ReadyTimeoutError], Awaitable[str]] | None = None,
    poll_s: float = 0.25,
) -> None:
    """``hello`` a fresh substrate until it answers, failing fast if it dies meanwhile.

    ``token`` is the substrate's key-derived token (a rejection says how to fix the secret).
    ``died()`` returns a message (with logs) once the substrate is gone, else None (omitted: it
    is not watched); ``timed_out(exc)`` builds the message of the ``ReadyTimeoutError`` raised
    after ``timeout`` (omitted: the connect error as is).
    The probe's session is closed with ``bye``: the rollout opens its own.
    """
    from ..client.envclient import connect

    probe = asyncio.ensure_future(connect(url, ready_timeout=timeout, token=token, keepalive_s=None))
    try:
        while True:
            done, _ = await asyncio.wait({probe}, timeout=poll_s)
            if done:
                break
            message = await died() if died is not None else None
            if message is not None:
                raise ProviderError(message)
        try:
            client = probe.result()
        except ReadyTimeoutError as exc:
            if timed_out is None:
                raise
            raise ReadyTimeoutError(await timed_out(exc)) from exc
        except UnauthorizedError as exc:
            raise token_rejected(exc, url) from exc
        try:
            await client.bye()
        finally:
            await client.close()
    finally:
        if not probe.done():
            probe.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await probe
