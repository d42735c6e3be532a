"""Process entry for serving an environment: load it, serve it, stop cleanly on SIGTERM/SIGINT.

Shared by ``python -m durable_rollouts.envserver`` and ``rollouts serve``. User mistakes (a
missing file, no environment, a public bind without a token) print one line on stderr and return
2; a failing initialize hook returns 1 with the hook's name. A HUD v6 env file is served by
hud's own server (``server.serving``): only on loopback, without a token (else exit 2). The token comes from the
``ROLLOUTS_ENV_TOKEN`` environment variable, never from argv. ``max_connections`` and
``max_tasks`` bound what one client can make the server hold (see ``EnvServer``).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from ..errors import ConfigError, EnvError
from ..settings import settings, var
from ..hud_detect import is_hud_environment
from .environment import Environment
from .hud_env import check_hud_serving
from .loader import load_environment
from .server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TASKS, is_loopback, serve

__all__ = ["TOKEN_ENV_VAR", "run_serve"]

TOKEN_ENV_VAR = var("env_token")


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


async def _serve_until_signal(
    env: Environment, host: str, port: int, token: str | None, *, park_ttl_s: float, max_connections: int, max_tasks: int
) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    try:
        await serve(
            env, host, port, token=token, park_ttl_s=park_ttl_s, max_connections=max_connections, max_tasks=max_tasks
        )
    except asyncio.CancelledError:
        return 0
    except (EnvError, ConfigError) as exc:
        _error(str(exc))
        return 1
    except OSError as exc:
        _error(f"cannot listen on {host}:{port}: {exc}")
        return 1
    return 0


def run_serve(
    target: str,
    *,
    env_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    park_ttl_s: float = 3600.0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> int:
    """Serve the environment in ``target`` until SIGTERM/SIGINT; returns the exit code."""
    try:
        secret = settings().env_token
    except ConfigError as exc:
        _error(str(exc))
        return 2
    token = secret.get_secret_value() if secret is not None else None
    if not is_loopback(host) and not token:
        _error(f"binding to {host} needs a token: set {TOKEN_ENV_VAR}")
        return 2
    if port < 0 or port > 65535:
        _error(f"invalid port {port}")
        return 2
    for name, limit in (("max-connections", max_connections), ("max-tasks", max_tasks)):
        if limit < 1:
            _error(f"--{name} must be at least 1, got {limit}")
            return 2
    try:
        env = load_environment(target, env_name)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    except Exception as exc:  # the env file itself is broken: still one readable line
        _error(f"cannot load {target}: {type(exc).__name__}: {exc}")
        return 2
    if is_hud_environment(env):  # served by hud's own server: loopback, no token
        try:
            check_hud_serving(env, loopback=is_loopback(host), token=token)
        except ConfigError as exc:
            _error(str(exc))
            return 2
    return asyncio.run(
        _serve_until_signal(
            env, host, port, token, park_ttl_s=park_ttl_s, max_connections=max_connections, max_tasks=max_tasks
        )
    )
