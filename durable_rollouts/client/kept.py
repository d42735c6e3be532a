"""Control connections a rollout step leaves open for the next step of its rollout, in this process.

Every step of a rollout reconnects to its session (``hello{session_id}``), so each may run in a
fresh process. For a substrate only this process serves (``LocalRuntime``'s in-process env
server, which marks its endpoints ``params["keep"]``), every step of the rollout runs in this
process anyway, so a step that ends well leaves its connection here instead of closing it, and
the next step takes it back: one connection, one ``hello``, per rollout instead of one per step.
Nothing else changes: a step that finds nothing kept (a retry, another process, a kept connection
gone stale after ``KEEP_S``) resumes the session as before, and a failed step never keeps its
connection. Imports the client only; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..models import Endpoint
from .envclient import EnvClient

__all__ = ["KEEP_S", "keep_or_close", "keeps", "lent", "take"]

KEEP_S = 30.0
"""A kept connection not taken back within this many seconds is closed (its session parks)."""

_KEPT: dict[tuple[str, str], tuple[EnvClient, asyncio.TimerHandle]] = {}
_CLOSING: set[asyncio.Task[None]] = set()


def keeps(endpoint: Endpoint) -> bool:
    """Whether steps may keep ``endpoint``'s connections open for each other (see the module)."""
    return endpoint.params.get("keep") is True


def take(endpoint: Endpoint, session_id: str) -> EnvClient | None:
    """The open connection a step of this rollout left for ``session_id``, now the caller's."""
    entry = _KEPT.pop((endpoint.url, session_id), None)
    if entry is None:
        return None
    client, timer = entry
    timer.cancel()
    return client if client.connected else None


async def keep_or_close(endpoint: Endpoint, client: EnvClient) -> None:
    """Leave ``client`` open for the rollout's next step when ``endpoint`` allows it, else close it."""
    if not keeps(endpoint) or not client.connected or client.session_id is None:
        await client.close()
        return
    key = (endpoint.url, client.session_id)
    old = _KEPT.pop(key, None)
    if old is not None and old[0] is not client:
        old[1].cancel()
        await old[0].close()
    timer = asyncio.get_running_loop().call_later(KEEP_S, _expire, key)
    _KEPT[key] = (client, timer)


@contextlib.asynccontextmanager
async def lent(endpoint: Endpoint, client: EnvClient) -> AsyncIterator[EnvClient]:
    """A step's use of ``client``: closed if the step fails, else kept for the next step
    (:func:`keep_or_close`)."""
    try:
        yield client
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    await keep_or_close(endpoint, client)


def _expire(key: tuple[str, str]) -> None:
    entry = _KEPT.pop(key, None)
    if entry is None:
        return
    task = asyncio.get_running_loop().create_task(_close_quietly(entry[0]))
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


async def _close_quietly(client: EnvClient) -> None:
    with contextlib.suppress(Exception):
        await client.close()
