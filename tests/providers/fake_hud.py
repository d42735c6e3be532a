"""A local stand-in for HUD's runtime gateway: the session API and the WebSocket tunnels.

HUD's platform cannot be reached from here, so HUDRuntime's tests point it at this stand-in on
127.0.0.1, one aiohttp server answering both what HUDRuntime calls (the calls HUD 0.6.21's own
runtime makes)::

    POST   /runtime/sessions {"environment": NAME, "trace_id": T}  -> {"id": ...}; starts
                                                    that env's server
    GET    /runtime/sessions?trace_id=T             -> {"items": [{"id", "trace_id",
                                                    "environment"}]} (HUD's SDK makes no
                                                    such call: HUDRuntime's adoption needs it)
    DELETE /runtime/sessions/{id}                    -> stops it (404 when unknown)
    GET    /runtime/tunnels/{id}  (WebSocket)        -> bridged to the env server's TCP port

Every call needs ``Authorization: Bearer <API_KEY>`` (401 otherwise). A session's env is a REAL
``python -m durable_rollouts.envserver FILE`` process on this machine's loopback (no token: in
HUD the gateway is what authenticates), and each WebSocket is bridged byte for byte to a new TCP
connection to it: binary messages carry the bytes, as HUD's tunnels do. The client side under
test uses the ``websockets`` library, so this also checks the two implementations interoperate.

``events`` lists ``(made|gone, trace id)`` as sessions start and are deleted. With
``hold_create`` set, the next create starts its session and then never answers
(``create_held`` turns True), as a create whose caller dies before the answer comes;
``listing = False`` answers the listing 405, as a gateway without it.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from substrates_support import LoopThread

from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT

API_KEY = "standin-hud-key"


@dataclass
class HostedEnv:
    id: str
    environment: str
    proc: subprocess.Popen
    port: int
    trace_id: str | None = None


class HUDStandIn:
    """``envs`` maps environment names to env files; ``calls`` records (method, path, body)."""

    def __init__(self, envs: dict[str, Path], root: Path) -> None:
        self.envs, self.root = envs, root
        self.calls: list[tuple[str, str, Any]] = []
        self.sessions: dict[str, HostedEnv] = {}
        self.stopped: list[HostedEnv] = []
        self.tunnels_opened = 0
        self.refuse_tunnels = False  # answer every tunnel 503, as an overloaded gateway might
        self.events: list[tuple[str, str]] = []  # (made|gone, trace id), in order
        self.hold_create = False
        self.create_held = False
        self.listing = True
        self._ids = itertools.count(1)
        self._home = LoopThread()

    def start(self) -> HUDStandIn:
        self._home.run(self._start())
        return self

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/runtime/sessions", self._create)
        app.router.add_get("/runtime/sessions", self._list)
        app.router.add_delete("/runtime/sessions/{id}", self._delete)
        app.router.add_get("/runtime/tunnels/{id}", self._tunnel)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        self._home.loop.call_soon_threadsafe(self._stopping.set)
        self._home.run(self._runner.cleanup())
        self._home.close()
        for env in [*self.sessions.values(), *self.stopped]:
            _stop(env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {API_KEY}"

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("POST", request.path, body))
        if not self._authorized(request):
            return web.json_response({"detail": "invalid api key"}, status=401)
        source = self.envs.get(body.get("environment"))
        if source is None:
            return web.json_response({"detail": "unknown environment"}, status=404)
        sid = f"rs-{next(self._ids)}"
        log = self.root / f"{sid}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_rollouts.envserver", str(source), "--host",
                 "127.0.0.1", "--port", "0"],
                cwd=source.parent, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        env = HostedEnv(sid, body["environment"], proc, await _announced_port(proc, log),
                        body.get("trace_id"))
        self.sessions[env.id] = env
        self.events.append(("made", str(env.trace_id)))
        if self.hold_create:
            self.hold_create, self.create_held = False, True
            await self._stopping.wait()  # made, but its caller never hears so
        return web.json_response({"id": env.id})

    async def _list(self, request: web.Request) -> web.Response:
        self.calls.append(("GET", request.path_qs, None))
        if not self._authorized(request):
            return web.json_response({"detail": "invalid api key"}, status=401)
        if not self.listing:
            return web.json_response({"detail": "method not allowed"}, status=405)
        wanted = request.query.get("trace_id")
        return web.json_response({"items": [
            {"id": e.id, "trace_id": e.trace_id, "environment": e.environment}
            for e in self.sessions.values() if wanted is None or e.trace_id == wanted]})

    async def _delete(self, request: web.Request) -> web.Response:
        self.calls.append(("DELETE", request.path, None))
        if not self._authorized(request):
            return web.json_response({"detail": "invalid api key"}, status=401)
        env = self.sessions.pop(request.match_info["id"], None)
        if env is None:
            return web.json_response({"detail": "no such session"}, status=404)
        _stop(env)
        self.stopped.append(env)
        self.events.append(("gone", str(env.trace_id)))
        return web.Response(status=204)

    async def _tunnel(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(("GET", request.path, None))
        if not self._authorized(request):
            return web.json_response({"detail": "invalid api key"}, status=401)
        env = self.sessions.get(request.match_info["id"])
        if env is None:
            return web.json_response({"detail": "no such session"}, status=404)
        if self.refuse_tunnels:
            return web.json_response({"detail": "tunnels unavailable"}, status=503)
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self.tunnels_opened += 1
        reader, writer = await asyncio.open_connection("127.0.0.1", env.port)

        async def to_env() -> None:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    writer.write(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    writer.write(msg.data.encode())
                await writer.drain()

        async def from_env() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(data)

        pumps = [asyncio.ensure_future(to_env()), asyncio.ensure_future(from_env())]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        writer.close()
        await ws.close()
        return ws


async def _announced_port(proc: subprocess.Popen, log: Path) -> int:
    for _ in range(1200):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(SERVE_PORT_ANNOUNCEMENT):
                return int(line[len(SERVE_PORT_ANNOUNCEMENT):])
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.05)
    raise RuntimeError(f"hosted env did not announce its port: {log.read_text()[-2000:]}")


def _stop(env: HostedEnv) -> None:
    if env.proc.poll() is None:
        env.proc.kill()
    env.proc.wait(10)
