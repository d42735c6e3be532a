"""DaytonaRuntime's side of the ``daytona`` SDK: the client, its errors, resources, snapshots, gc.

Kept apart so ``daytona.py`` stays the placement logic. The SDK is imported inside functions
only; a missing package or missing credentials is a ``ConfigError`` saying what to install or
set, an SDK failure a ``ProviderError``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from ..errors import ConfigError, ProviderError
from ..models import Resources
from .base import Substrate
from .labels import LABEL_HOST, LABEL_OWNER
from .procs import pid_alive

__all__ = [
    "MANAGED_LABEL",
    "daytona_client",
    "list_sandboxes",
    "resources_for",
    "sandbox_by_id",
    "snapshot_ready",
    "state_of",
]

log = logging.getLogger(__name__)

MANAGED_LABEL = "durable-rollouts.provider"
"""Label (value: the provider kind) gc lists the sandboxes of this provider by."""

_CREDENTIAL_VARS = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN")
STARTING_STATES = frozenset({"creating", "starting", "restoring", "pending_build",
                             "building_snapshot", "pulling_snapshot"})
"""Sandbox states on the way to ``started``."""


def _sdk() -> Any:
    try:
        import daytona
    except ImportError as exc:
        raise ConfigError(
            "DaytonaRuntime needs the 'daytona' package: pip install 'durable-rollouts[daytona]'"
        ) from exc
    return daytona


@asynccontextmanager
async def daytona_client(what: str) -> AsyncIterator[Any]:
    """An ``AsyncDaytona`` configured from the environment (``DAYTONA_API_KEY`` ...), closed
    after; SDK failures inside are restated for ``what``: rejected credentials as ConfigError
    (no retry fixes them), the rest as ProviderError."""
    daytona = _sdk()
    try:
        client = daytona.AsyncDaytona()
    except daytona.DaytonaError as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    try:
        yield client
    except (daytona.DaytonaAuthenticationError, daytona.DaytonaForbiddenError) as exc:
        raise ConfigError(f"{what}: Daytona rejected the credentials: {exc}") from exc
    except daytona.DaytonaError as exc:
        raise ProviderError(f"{what}: {exc}") from exc
    finally:
        await client.close()


def resources_for(res: Resources) -> Any | None:
    """Daytona ``Resources`` for ``res`` (whole cpus, memory in GiB rounded up), None if unset."""
    kwargs: dict[str, int] = {}
    if res.cpu is not None:
        if not float(res.cpu).is_integer():
            raise ConfigError(f"DaytonaRuntime allocates whole cpus; resources.cpu={res.cpu:g}")
        kwargs["cpu"] = int(res.cpu)
    if res.memory_mb is not None:
        kwargs["memory"] = max(1, math.ceil(res.memory_mb / 1024))
    if res.gpu is not None:  # Daytona takes a count; a named type is rejected by ``honours``
        kwargs["gpu"] = res.gpu.count
    return _sdk().Resources(**kwargs) if kwargs else None


async def snapshot_ready(daytona: Any, name: str, timeout: float) -> Any | None:
    """Snapshot ``name`` once it is active (None when it does not exist); waits while it builds."""
    sdk = _sdk()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            snapshot = await daytona.snapshot.get(name)
        except sdk.DaytonaNotFoundError:
            return None
        state = state_of(snapshot)
        if state == "active":
            return snapshot
        if state in ("error", "build_failed", "inactive"):
            reason = snapshot.error_reason or "no reason given"
            raise ProviderError(f"Daytona snapshot {name!r} is {state}: {reason}")
        if asyncio.get_running_loop().time() > deadline:
            raise ProviderError(f"Daytona snapshot {name!r} still {state} after {timeout:g}s")
        await asyncio.sleep(1.0)


def state_of(obj: Any) -> str:
    """A sandbox's or snapshot's state as its wire string (the SDK has two enums for it)."""
    return str(getattr(obj.state, "value", obj.state))


def _configured() -> bool:
    return any(os.environ.get(var) for var in _CREDENTIAL_VARS)


async def _labelled(kind: str) -> list[Substrate]:
    sdk = _sdk()
    host = socket.gethostname()
    out = []
    async with daytona_client("Daytona gc") as daytona:
        query = sdk.ListSandboxesQuery(labels={MANAGED_LABEL: kind})
        async for sb in daytona.list(query):
            labels = dict(sb.labels or {})
            owner = labels.get(LABEL_OWNER, "")
            state = state_of(sb)
            out.append(Substrate(
                kind, labels, {"sandbox_id": sb.id, "name": sb.name},
                alive=state == "started" or state in STARTING_STATES,
                owner_gone=labels.get(LABEL_HOST) == host and owner.isdigit()
                and not pid_alive(int(owner)),
            ))
    return out


def list_sandboxes(kind: str) -> list[Substrate]:
    """The sandboxes labelled ``MANAGED_LABEL=kind`` ([] when Daytona is not configured here
    or does not answer). Blocking: runs the SDK on its own event loop in a helper thread."""
    if not _configured():
        return []
    try:
        _sdk()
    except ConfigError:
        return []
    with ThreadPoolExecutor(1, thread_name_prefix="daytona-gc") as pool:
        try:
            return pool.submit(asyncio.run, _labelled(kind)).result()
        except Exception as exc:  # noqa: BLE001 - gc goes on with the other providers
            log.warning("gc: cannot list Daytona sandboxes: %s", exc)
            return []


async def sandbox_by_id(sandbox_id: str, *, delete: bool = False) -> Any | None:
    """The sandbox ``sandbox_id`` (None when gone); deleted first with ``delete``."""
    sdk = _sdk()
    async with daytona_client("Daytona gc") as daytona:
        try:
            sandbox = await daytona.get(sandbox_id)
            if delete:
                await daytona.delete(sandbox)
            return sandbox
        except sdk.DaytonaNotFoundError:
            return None
