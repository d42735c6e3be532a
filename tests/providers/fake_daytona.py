"""A local stand-in for Daytona's cloud: its REST API, the sandbox toolbox and the SSH gateway.

Daytona's cloud cannot be reached from here, so DaytonaRuntime's tests point the REAL ``daytona``
SDK (``DAYTONA_API_URL``) at this stand-in on 127.0.0.1. It implements only the endpoints the
SDK calls for DaytonaRuntime, read from the installed SDK (``daytona_api_client_async``'s
SandboxApi and SnapshotsApi, ``daytona_toolbox_api_client_async``'s ProcessApi)::

    POST   /api/sandbox                      create (state "creating"; "started" once read)
    GET    /api/sandbox/{idOrName}           get
    GET    /api/sandbox?labels=JSON          list (one page)
    DELETE /api/sandbox/{idOrName}           delete (kills the sandbox's processes)
    POST   /api/sandbox/{idOrName}/ssh-access?expiresInMinutes=N
    GET    /api/snapshots/{idOrName}, POST /api/snapshots ("pending", then "active" once read)
    toolbox, at toolboxProxyUrl + /{sandboxId}:
    POST /process/session, GET /process/session/{sid}, POST /process/session/{sid}/exec,
    GET  /process/session/{sid}/command/{cid}, GET /process/session/{sid}/command/{cid}/logs

Anything else answers 404 (the SDK's Socket.IO event channel then falls back to polling). A
"sandbox" is a directory, and a session command a real ``sh -c`` process started there with
the sandbox's environment, so the env server it starts is real. The SSH gateway is an asyncssh
server accepting a user name that is a live access token, with no other authentication, and
opening direct-tcpip channels to loopback only (the sandbox processes share this machine's
loopback). Everything runs on its own event loop in a thread, so blocking test code cannot
stall it. It is not Daytona: images, resources and TTLs are only recorded.

``events`` lists ``(made|gone, rollout key)`` as sandboxes are created and deleted. With
``hold_create`` set, the next create makes its sandbox and then never answers (``create_held``
turns True), as a create whose caller dies before the answer comes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
from aiohttp import web
from substrates_support import LoopThread

API_KEY = "standin-api-key"


@dataclass
class Command:
    id: str
    command: str
    proc: subprocess.Popen
    out: Path
    err: Path

    def exit_code(self) -> int | None:
        return self.proc.poll()


@dataclass
class Sandbox:
    id: str
    name: str
    body: dict[str, Any]
    home: Path
    state: str = "creating"
    sessions: dict[str, dict[str, Command]] = field(default_factory=dict)

    def processes(self) -> list[subprocess.Popen]:
        return [c.proc for cmds in self.sessions.values() for c in cmds.values()]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"statusCode": status, "message": message}, status=status)


class DaytonaStandIn:
    """Start with ``start()``, stop with ``stop()``; ``calls`` records (method, path, body)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, str, Any]] = []
        self.sandboxes: dict[str, Sandbox] = {}
        self.deleted: dict[str, Sandbox] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.ssh_tokens: dict[str, str] = {}  # token -> sandbox id
        self.forwards: list[tuple[str, int]] = []  # direct-tcpip channels the gateway opened
        self.events: list[tuple[str, str]] = []  # (made|gone, rollout key), in order
        self.hold_create = False
        self.create_held = False
        self._ids = itertools.count(1)
        self._home: LoopThread | None = None
        self._bin = root / "bin"  # `python` on the sandboxes' PATH: this interpreter
        self._bin.mkdir(parents=True, exist_ok=True)
        python = self._bin / "python"
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        self.known_hosts = root / "gateway_known_hosts"

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> DaytonaStandIn:
        self._home = LoopThread()
        self._home.run(self._start())
        return self

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.http_port = self._runner.addresses[0][1]
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._ssh = await asyncssh.create_server(
            lambda: _Gateway(self), "127.0.0.1", 0, server_host_keys=[host_key]
        )
        self.ssh_port = self._ssh.sockets[0].getsockname()[1]
        self.known_hosts.write_text(
            f"[127.0.0.1]:{self.ssh_port} {host_key.export_public_key().decode()}"
        )

    def stop(self) -> None:
        async def _stop() -> None:
            self._stopping.set()
            self._ssh.close()
            await self._runner.cleanup()

        assert self._home is not None
        self._home.run(_stop())
        self._home.close()
        for sb in [*self.sandboxes.values(), *self.deleted.values()]:
            _kill(sb)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/api"

    @property
    def ssh_host(self) -> str:
        return f"127.0.0.1:{self.ssh_port}"

    def add_snapshot(self, name: str, **fields: Any) -> None:
        self.snapshots[name] = self._snapshot_dto(name, "active", fields)

    def sandbox_named(self, name: str) -> Sandbox | None:
        return next((s for s in self.sandboxes.values() if s.name == name), None)

    def posted(self, path: str) -> list[Any]:
        return [body for method, p, body in self.calls if method == "POST" and p == path]

    # -- HTTP -----------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, body))
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return _error(401, "Invalid credentials")
        parts = [p for p in request.path.split("/") if p]
        if parts[:1] == ["api"]:
            answer = self._api(request, parts[1:], body)
            if parts[1:] == ["sandbox"] and request.method == "POST" and self.hold_create:
                self.hold_create, self.create_held = False, answer.status == 200
                await self._stopping.wait()  # made, but its caller never hears so
            return answer
        if parts[:1] == ["toolbox"] and len(parts) >= 3:
            sb = self.sandboxes.get(parts[1])
            if sb is None:
                return _error(404, f"sandbox {parts[1]} not found")
            return self._toolbox(request.method, sb, parts[2:], body)
        return _error(404, "not found")

    def _api(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        method = request.method
        if parts == ["sandbox"] and method == "POST":
            return self._create(body)
        if parts == ["sandbox"] and method == "GET":
            wanted = json.loads(request.query.get("labels") or "{}")
            items = [self._dto(s) for s in self.sandboxes.values()
                     if all(s.body["labels"].get(k) == v for k, v in wanted.items())]
            return web.json_response({"items": items, "nextCursor": None})
        if parts[:1] == ["sandbox"] and len(parts) >= 2:
            sb = self._lookup(parts[1])
            if sb is None:
                return _error(404, f"Sandbox with ID or name {parts[1]} not found")
            if len(parts) == 2 and method == "GET":
                if sb.state == "creating":
                    sb.state = "started"  # booted by the time anyone looks
                return web.json_response(self._dto(sb))
            if len(parts) == 2 and method == "DELETE":
                del self.sandboxes[sb.id]
                self.deleted[sb.id] = sb
                self.events.append(("gone", _key_of(sb)))
                sb.state = "destroying"
                _kill(sb)
                return web.json_response(self._dto(sb))
            if parts[2:] == ["ssh-access"] and method == "POST":
                token = uuid.uuid4().hex
                self.ssh_tokens[token] = sb.id
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                return web.json_response({
                    "id": uuid.uuid4().hex, "sandboxId": sb.id, "token": token,
                    "expiresAt": now, "createdAt": now, "updatedAt": now,
                    "sshCommand": f"ssh -p {self.ssh_port} {token}@127.0.0.1",
                })
        if parts[:1] == ["snapshots"]:
            if method == "POST":
                if body["name"] in self.snapshots:
                    return _error(409, f"snapshot {body['name']} already exists")
                snap = self._snapshot_dto(body["name"], "pending", body)
                self.snapshots[body["name"]] = snap
                return web.json_response(snap)
            snap = next((s for s in self.snapshots.values()
                         if len(parts) == 2 and parts[1] in (s["id"], s["name"])), None)
            if snap is None:
                return _error(404, "snapshot not found")
            reply = dict(snap)
            snap["state"] = "active"  # built by the next read
            return web.json_response(reply)
        return _error(404, "not found")

    def _create(self, body: dict[str, Any]) -> web.Response:
        name = body.get("name") or uuid.uuid4().hex
        if self.sandbox_named(name) is not None:
            return _error(409, f"Sandbox with name {name} already exists")
        snapshot = body.get("snapshot")
        if snapshot and (snapshot not in self.snapshots
                         or self.snapshots[snapshot]["state"] != "active"):
            return _error(400, f"Snapshot {snapshot} not found or not active")
        sid = f"sb-{next(self._ids)}"
        home = self.root / sid
        home.mkdir()
        sb = Sandbox(sid, name, body, home)
        self.sandboxes[sid] = sb
        self.events.append(("made", _key_of(sb)))
        return web.json_response(self._dto(sb))

    def _lookup(self, id_or_name: str) -> Sandbox | None:
        return self.sandboxes.get(id_or_name) or self.sandbox_named(id_or_name)

    def _dto(self, sb: Sandbox) -> dict[str, Any]:
        b = sb.body
        return {
            "id": sb.id, "organizationId": "org-standin", "name": sb.name,
            "snapshot": b.get("snapshot"), "user": "daytona", "env": b.get("env") or {},
            "labels": b.get("labels") or {}, "public": False, "networkBlockAll": False,
            "kvm": False, "target": "standin", "cpu": b.get("cpu") or 1,
            "gpu": b.get("gpu") or 0, "memory": b.get("memory") or 1, "disk": b.get("disk") or 3,
            "state": sb.state, "autoStopInterval": b.get("autoStopInterval"),
            "autoDeleteInterval": b.get("autoDeleteInterval"),
            "toolboxProxyUrl": f"http://127.0.0.1:{self.http_port}/toolbox",
        }

    @staticmethod
    def _snapshot_dto(name: str, state: str, fields: dict[str, Any]) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "id": f"snap-{name}", "name": name, "general": False, "state": state,
            "imageName": fields.get("imageName"), "size": None, "entrypoint": None,
            "cpu": fields.get("cpu") or 1, "gpu": fields.get("gpu") or 0,
            "mem": fields.get("memory") or fields.get("mem") or 1, "disk": fields.get("disk") or 3,
            "errorReason": None, "createdAt": now, "updatedAt": now, "lastUsedAt": None,
            "sourceSandboxId": None,
        }

    # -- toolbox --------------------------------------------------------------------------------

    def _toolbox(self, method: str, sb: Sandbox, parts: list[str], body: Any) -> web.Response:
        if parts == ["process", "session"] and method == "POST":
            sb.sessions.setdefault(body["sessionId"], {})
            return web.Response(status=201)
        if parts[:2] != ["process", "session"] or len(parts) < 3:
            return _error(404, "not found")
        session = sb.sessions.get(parts[2])
        if session is None:
            return _error(404, f"session {parts[2]} not found")
        if len(parts) == 3 and method == "GET":
            return web.json_response({"sessionId": parts[2], "commands": [
                {"id": c.id, "command": c.command, "exitCode": c.exit_code()}
                for c in session.values()]})
        if parts[3:] == ["exec"] and method == "POST":
            cmd = self._spawn(sb, body["command"])
            session[cmd.id] = cmd
            return web.json_response({"cmdId": cmd.id})
        if len(parts) >= 5 and parts[3] == "command" and parts[4] in session:
            cmd = session[parts[4]]
            if len(parts) == 5:
                return web.json_response(
                    {"id": cmd.id, "command": cmd.command, "exitCode": cmd.exit_code()})
            if parts[5:] == ["logs"]:
                out, err = _read(cmd.out), _read(cmd.err)
                return web.json_response({"output": out + err, "stdout": out, "stderr": err})
        return _error(404, "not found")

    def _spawn(self, sb: Sandbox, command: str) -> Command:
        cid = f"cmd-{next(self._ids)}"
        out, err = sb.home / f"{cid}.out", sb.home / f"{cid}.err"
        env = dict(os.environ, HOME=str(sb.home), **(sb.body.get("env") or {}))
        env["PATH"] = f"{self._bin}:{env.get('PATH', '')}"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(["sh", "-c", command], cwd=sb.home, env=env, stdout=o,
                                    stderr=e, stdin=subprocess.DEVNULL, start_new_session=True)
        return Command(cid, command, proc, out, err)


class _Gateway(asyncssh.SSHServer):
    """Daytona's SSH gateway: the user name is the access token; forwards to loopback only."""

    def __init__(self, cloud: DaytonaStandIn) -> None:
        self.cloud = cloud

    def begin_auth(self, username: str) -> bool:
        sandbox = self.cloud.ssh_tokens.get(username)
        return sandbox is None or sandbox not in self.cloud.sandboxes  # True: no way in

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> bool:
        if dest_host not in ("127.0.0.1", "localhost"):
            return False
        self.cloud.forwards.append((dest_host, dest_port))
        return True


def _key_of(sb: Sandbox) -> str:
    return str((sb.body.get("labels") or {}).get("durable-rollouts.key", ""))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _kill(sb: Sandbox) -> None:
    for proc in sb.processes():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)
