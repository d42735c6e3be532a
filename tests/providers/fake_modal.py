"""A stand-in for the ``modal`` SDK boundary, for testing ModalRuntime where Modal is unreachable.

It mimics the calls ModalRuntime makes (``App.lookup``, ``Image.from_registry/from_id``,
``Sandbox.create/list/from_id``, ``sandbox.tunnels/poll/terminate/get_tags``, ``.aio`` style),
records every call, and runs each "sandbox" as a REAL local env server process
(``python -m durable_rollouts.envserver $ROLLOUTS_ENV_FILE --host 127.0.0.1``) with the token
from the sandbox environment, so the provider's tunnel lookup, readiness probe, reuse and
termination run against a real server. It is not Modal: image, cpu, memory and gpu are only
recorded.

``FakeModal(dir, shared=True)`` keeps its sandboxes in ``dir`` (one JSON record each), so every
process that builds one on the same directory sees the same "cloud": a worker process gets it
through ``modal_shim/`` on its PYTHONPATH (``$FAKE_MODAL_DIR``), and sandboxes made by a worker
that died are listed, found and terminated by the next. ``events.log`` there holds one line
``made|gone KEY ID`` per sandbox started or terminated. Touch ``hold-create`` there to hold the
next create's answer forever (after the sandbox is made; ``create-held`` then appears), as a
create whose caller dies before the answer comes.
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
import types
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT


class _Aio:
    """A function called modal-style: ``obj.method.aio(...)``."""

    def __init__(self, fn: Any) -> None:
        self.aio = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the stand-in only supports the .aio calling convention")


class _Error(Exception):
    pass


class _Tunnel:
    def __init__(self, host: str, port: int) -> None:
        self.tcp_socket = (host, port)


class _Stream:
    def __init__(self, path: Path) -> None:
        self.read = _Aio(self._read)
        self._path = path

    async def _read(self) -> str:
        return self._path.read_text(errors="replace") if self._path.exists() else ""


class _Attached:
    """A sandbox process another process started (shared mode): ``Popen``'s poll/kill/wait by pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return -9
        return -9 if state in ("Z", "X") else None

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return code


class FakeSandbox:
    def __init__(
        self,
        modal: FakeModal,
        object_id: str,
        name: str | None,
        tags: dict[str, str],
        env: dict[str, str],
        ports: list[int],
        log: Path,
        pid: int | None = None,
    ) -> None:
        self.modal, self.object_id, self.name = modal, object_id, name
        self.tags, self.env, self.ports, self.log = dict(tags), dict(env), list(ports), log
        self.stdout = _Stream(log)
        self.stderr = _Stream(log.with_suffix(".none"))
        self.tunnels = _Aio(self._tunnels)
        self.poll = _Aio(self._poll)
        self.terminate = _Aio(self._terminate)
        self.get_tags = _Aio(self._get_tags)
        if pid is not None:
            self.proc: Any = _Attached(pid)
            return
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_rollouts.envserver",
                    env["ROLLOUTS_ENV_FILE"],
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, ROLLOUTS_ENV_TOKEN=env["ROLLOUTS_ENV_TOKEN"]),
                start_new_session=True,
            )

    def record(self) -> dict[str, Any]:
        return {"object_id": self.object_id, "name": self.name, "tags": self.tags,
                "env": self.env, "ports": self.ports, "log": str(self.log), "pid": self.proc.pid}

    async def _tunnels(self, timeout: int = 50) -> dict[int, _Tunnel]:
        self.modal.calls.append(("tunnels", self.object_id))
        for _ in range(int(timeout * 50)):
            text = self.log.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith(SERVE_PORT_ANNOUNCEMENT):
                    port = int(line[len(SERVE_PORT_ANNOUNCEMENT) :])
                    return {p: _Tunnel("127.0.0.1", port) for p in self.ports}
            if self.proc.poll() is not None:
                return {p: _Tunnel("127.0.0.1", 1) for p in self.ports}  # nothing listens there
            await asyncio.sleep(0.02)
        raise _Error("tunnels timed out")

    async def _poll(self) -> int | None:
        return self.proc.poll()

    async def _terminate(self) -> None:
        self.modal.calls.append(("terminate", self.object_id))
        if self.proc.poll() is None:
            self.proc.kill()
            self.modal.event("gone", self)
        self.proc.wait(5)

    async def _get_tags(self) -> dict[str, str]:
        return dict(self.tags)


class FakeModal(types.ModuleType):
    """Install with ``monkeypatch.setitem(sys.modules, "modal", FakeModal(tmp_path))``."""

    def __init__(self, workdir: Path, *, shared: bool = False) -> None:
        super().__init__("modal")
        self.workdir = workdir
        self.shared = shared
        self.calls: list[tuple[Any, ...]] = []
        self.sandboxes: dict[str, FakeSandbox] = {}
        self._ids = itertools.count(1)
        self.exception = types.SimpleNamespace(
            AuthError=type("AuthError", (_Error,), {}),
            NotFoundError=type("NotFoundError", (_Error,), {}),
            AlreadyExistsError=type("AlreadyExistsError", (_Error,), {}),
        )
        self.App = types.SimpleNamespace(lookup=_Aio(self._lookup))
        self.Image = types.SimpleNamespace(from_registry=self._from_registry, from_id=self._image_from_id)
        self.Sandbox = types.SimpleNamespace(
            create=_Aio(self._create), list=_Aio(self._list), from_id=_Aio(self._from_id)
        )

    async def _lookup(self, name: str, *, create_if_missing: bool = False) -> Any:
        self.calls.append(("App.lookup", name, create_if_missing))
        return types.SimpleNamespace(app_id=f"ap-{name}", name=name)

    def _from_registry(self, tag: str) -> Any:
        self.calls.append(("Image.from_registry", tag))
        return ("image", tag)

    def _image_from_id(self, image_id: str) -> Any:
        self.calls.append(("Image.from_id", image_id))
        return ("image-id", image_id)

    async def _create(
        self,
        *command: str,
        app: Any,
        name: str | None = None,
        tags: dict[str, str] | None = None,
        image: Any = None,
        env: dict[str, str] | None = None,
        timeout: int = 300,
        unencrypted_ports: list[int] = (),
        **kwargs: Any,
    ) -> FakeSandbox:
        self.calls.append(
            (
                "Sandbox.create",
                command,
                dict(
                    app_id=app.app_id,
                    name=name,
                    tags=tags,
                    image=image,
                    env=env,
                    timeout=timeout,
                    unencrypted_ports=list(unencrypted_ports),
                    **kwargs,
                ),
            )
        )
        if name is not None and any(
            s.name == name and s.proc.poll() is None for s in self.sandboxes.values()
        ):
            raise self.exception.AlreadyExistsError(f"sandbox {name} exists")
        assert list(command) == ["rollouts-env"], command
        if name is not None and self.shared and any(
            s.name == name and s.proc.poll() is None for s in self._on_disk()
        ):
            raise self.exception.AlreadyExistsError(f"sandbox {name} exists")
        object_id = f"sb-{uuid.uuid4().hex[:8]}" if self.shared else f"sb-{next(self._ids)}"
        sb = FakeSandbox(
            self,
            object_id,
            name,
            tags or {},
            env or {},
            list(unencrypted_ports),
            self.workdir / f"{object_id}.log",
        )
        self.sandboxes[object_id] = sb
        if self.shared:
            # Atomically (write, then rename): another process's _on_disk never reads half a record.
            tmp = self.workdir / f".{object_id}.json.tmp"
            tmp.write_text(json.dumps(sb.record()))
            os.replace(tmp, self.workdir / f"{object_id}.json")
        self.event("made", sb)
        with suppress(FileNotFoundError):  # claimed by exactly one create, of any process
            (self.workdir / "hold-create").rename(self.workdir / "create-held")
            await asyncio.Event().wait()  # made, but its caller never hears so
        return sb

    def event(self, what: str, sb: FakeSandbox) -> None:
        with open(self.workdir / "events.log", "a") as log:
            log.write(f"{what} {sb.tags.get('durable-rollouts.key', '')} {sb.object_id}\n")

    def _on_disk(self) -> list[FakeSandbox]:
        """Shared mode: every sandbox any process made on this directory."""
        for path in sorted(self.workdir.glob("sb-*.json")):
            rec = json.loads(path.read_text())
            if rec["object_id"] not in self.sandboxes:
                self.sandboxes[rec["object_id"]] = FakeSandbox(
                    self, rec["object_id"], rec["name"], rec["tags"], rec["env"], rec["ports"],
                    Path(rec["log"]), pid=rec["pid"])
        return list(self.sandboxes.values())

    async def _list(self, *, app_id: str | None = None, tags: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        self.calls.append(("Sandbox.list", app_id, tags))
        for sb in self._on_disk() if self.shared else list(self.sandboxes.values()):
            if all(sb.tags.get(k) == v for k, v in (tags or {}).items()):
                yield sb

    async def _from_id(self, object_id: str) -> FakeSandbox:
        if self.shared:
            self._on_disk()
        if object_id not in self.sandboxes:
            raise self.exception.NotFoundError(object_id)
        return self.sandboxes[object_id]

    def shutdown(self) -> None:
        for sb in self._on_disk() if self.shared else self.sandboxes.values():
            if sb.proc.poll() is None:
                sb.proc.kill()
            sb.proc.wait(5)
