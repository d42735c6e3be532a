"""Serving a HUD v6 ``hud.Environment`` with hud's own server, in this process.

An env file written for HUD (``from hud import Environment``) runs unchanged: the loader returns
the user's ``hud.Environment`` and :func:`~durable_rollouts.envserver.server.serving` hands it to
:func:`serving_hud`, which runs hud's own initialize hooks and binds hud's own control-channel
server (``hud.environment.server.bind``) — the wire our client speaks — instead of re-implementing
hud. Stopping uses hud's own shutdown of that server (what hud's ``serve`` and ``LocalRuntime``
call: it cancels the connections and tears every parked task down), then hud's shutdown hooks.

hud's server has no token authentication, so a HUD environment is only served on loopback and
without a token. Imports hud lazily (only for a HUD environment, which means hud is installed);
never ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, EnvError
from ..hud_detect import import_hud

__all__ = ["HudServer", "check_hud_serving", "serving_hud"]

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 0.05


@dataclass
class HudServer:
    """Where hud's server for one environment listens (what ``serving`` yields for a HUD env)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def check_hud_serving(env: Any, *, loopback: bool, token: object) -> None:
    """Refuse what hud's server cannot do safely: a token, or a non-loopback address."""
    if token:
        raise ConfigError(
            f"environment {env.name!r} is a HUD environment, served by hud's own server, which has "
            "no token authentication: unset ROLLOUTS_ENV_TOKEN and serve it on loopback"
        )
    if not loopback:
        raise ConfigError(
            f"environment {env.name!r} is a HUD environment, served by hud's own server, which has "
            "no token authentication: it is only served on loopback (127.0.0.1)"
        )


@contextlib.asynccontextmanager
async def serving_hud(env: Any, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[HudServer]:
    """Run ``env``'s hooks and serve it with hud's server for the duration of the block."""
    server_module = import_hud("hud.environment.server", f"environment {env.name!r}")
    try:
        await env.start()
    except Exception as exc:
        await _stop_env(env)
        raise EnvError(f"initialize hook of HUD environment {env.name!r} failed: {exc!r}") from exc
    try:
        server = await server_module.bind(env, host, port)
    except BaseException:
        await _stop_env(env)
        raise
    try:
        yield HudServer(host=host, port=server.sockets[0].getsockname()[1])
    finally:
        try:
            # Connections whose clients already hung up end on their own in a moment; hud's
            # shutdown cancels what is left, which Python 3.11's asyncio reports as an error.
            server.close()
            await asyncio.sleep(CLOSE_GRACE_S)
            # hud's own teardown of a bound server (the one its serve() and LocalRuntime use).
            await server_module._shutdown(server)
        finally:
            await _stop_env(env)


async def _stop_env(env: Any) -> None:
    """hud's shutdown hooks (best effort, as hud runs them), in a task of their own.

    A hook that awaits a task it has just cancelled ends in CancelledError (HUD's documented MCP
    example does: its ``suppress(Exception)`` does not catch it). Under ``hud serve`` that happens
    at process exit; served in a worker process it must not cancel whoever stops the environment
    (a ``LocalRuntime`` release): it is logged, and the hooks after it did not run.
    """
    stopping = asyncio.ensure_future(env.stop())
    await asyncio.wait({stopping})
    if stopping.cancelled():
        log.warning("a shutdown hook of HUD environment %r raised CancelledError; the hooks "
                    "registered before it did not run", env.name)
        return
    stopping.result()
