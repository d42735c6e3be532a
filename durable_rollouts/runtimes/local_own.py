"""``LocalRuntime``'s default: each rollout is served an Environment of its own.

Seed 001: "two rollouts never share state because they never share a substrate". A path source
is run again for every rollout (a new Environment with its own module globals; the modules the
file imports stay cached), a ``(task) -> Environment`` callable is called for every rollout, and
a live Environment object is lent to one rollout at a time: a lock per object, held from the
rollout's acquire to its release. Each rollout's server runs the initialize hooks when it starts
and the shutdown hooks when it is released. ``LocalRuntime(..., shared=True)`` keeps one server
per Environment object instead (``local.py``). Imports envserver lazily.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar
from weakref import WeakValueDictionary

__all__ = ["lend", "serve_alone"]


class _Stoppable(Protocol):
    after: list[Callable[[], None]]


S = TypeVar("S", bound=_Stoppable)

# env object -> its lock; an entry lives while some rollout holds or waits for the lock.
_LENT: WeakValueDictionary[Any, asyncio.Lock] = WeakValueDictionary()


async def lend(env: Any) -> Callable[[], None]:
    """Wait until no other rollout holds ``env``; returns what gives it back."""
    lock = _LENT.get(env)
    if lock is None:
        lock = _LENT[env] = asyncio.Lock()
    await lock.acquire()
    return lock.release


async def serve_alone(env: Any, start: Callable[[], Awaitable[S]]) -> S:
    """Serve ``env`` for one rollout: lend it, then ``start()`` its server. The server's
    ``after`` callbacks (run once it has stopped) give the env back and drop a fresh load's
    module."""
    from ..envserver.loader import forget_fresh

    give_back = await lend(env)
    try:
        served = await start()
    except BaseException:
        give_back()
        forget_fresh(env)
        raise
    served.after.extend((give_back, lambda: forget_fresh(env)))
    return served


def finish(served: _Stoppable) -> None:
    """Run the ``after`` callbacks once (the server has stopped or died)."""
    callbacks, served.after[:] = list(served.after), []
    for callback in callbacks:
        callback()
