"""Long-running CLI services: ``rollouts server`` (embedded Temporal), ``rollouts worker``, ``gc``,
and the detached background worker of ``run --detach`` (``spawn_worker``; it exits at
``temporal.control.wait_closed``).

``server`` starts the embedded dev server the other commands reuse (``$ROLLOUTS_HOME/temporal.json``)
and keeps it in the foreground until Ctrl-C/SIGTERM, then stops it. ``worker --until-job`` is
the background worker of ``run --detach``: it exits once that job has closed. Imports
``durable_rollouts.temporal`` and the worker lazily (never temporalio itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from ..paths import rollouts_home
from ..processes import pid_alive
from ..settings import WORKER_READY, settings

__all__ = [
    "collect_garbage",
    "run_server",
    "run_worker",
    "server_status",
    "server_stop",
    "spawn_worker",
    "stop_event",
]


def _running_server() -> dict[str, Any] | None:
    """The embedded server recorded in ``$ROLLOUTS_HOME/temporal.json`` if it still answers."""
    try:
        state = json.loads((rollouts_home() / "temporal.json").read_text())
        alive = pid_alive(int(state["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not alive:
        return None
    with socket.socket() as sock:
        sock.settimeout(0.5)
        if sock.connect_ex(("127.0.0.1", int(state["port"]))) != 0:
            return None
    return state


def _server_info(state: dict[str, Any]) -> dict[str, Any]:
    ui = f"http://127.0.0.1:{state['ui_port']}" if state.get("ui_port") else None
    return {
        "running": True,
        "pid": int(state["pid"]),
        "address": f"127.0.0.1:{state['port']}",
        "ui": ui,
        "db_file": state.get("db_file"),
        "home": str(rollouts_home()),
    }


async def server_status(out: Console, *, as_json: bool = False) -> int:
    """``rollouts server status``: the embedded server's addresses, pid, db file; 1 if none runs."""
    state = _running_server()
    if state is None:
        if as_json:
            out.print_json(json.dumps({"running": False, "home": str(rollouts_home())}))
        else:
            out.print(
                f"no embedded Temporal server is running (ROLLOUTS_HOME {rollouts_home()})",
                highlight=False,
            )
        return 1
    info = _server_info(state)
    if as_json:
        out.print_json(json.dumps(info))
        return 0
    out.print(f"running   pid {info['pid']}", highlight=False)
    out.print(f"gRPC      {info['address']}", highlight=False)
    out.print(f"Web UI    {info['ui'] or 'none (headless)'}", highlight=False, soft_wrap=True)
    out.print(f"database  {info['db_file']}", highlight=False, soft_wrap=True)
    out.print("stop it with: rollouts server stop", highlight=False)
    return 0


async def server_stop(out: Console) -> int:
    """``rollouts server stop``: stop the embedded server (SIGTERM, then SIGKILL); 0 either way."""
    from ..temporal.connection import stop_dev_server

    state = _running_server()
    stopped = await asyncio.to_thread(stop_dev_server)
    if stopped and state is not None:
        out.print(f"stopped the embedded Temporal server (pid {state['pid']})", highlight=False)
    elif stopped:
        out.print("stopped the embedded Temporal server", highlight=False)
    else:
        out.print("no embedded Temporal server was running", highlight=False)
    return 0


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C) on the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def run_server(out: Console, *, port: int | None, ui_port: int | None, headless: bool) -> int:
    """Run the embedded Temporal dev server in the foreground (reuse it if one already runs)."""
    from durable_rollouts.temporal.connection import ensure_dev_server, stop_dev_server

    running = _running_server()
    if running is not None:
        ui = (
            f"http://127.0.0.1:{running['ui_port']}"
            if running.get("ui_port")
            else "none (headless)"
        )
        out.print(
            f"already running (pid {running['pid']}): gRPC 127.0.0.1:{running['port']}, Web UI {ui}",
            highlight=False,
        )
        return 0
    stop = stop_event()
    server = await ensure_dev_server(port=port, ui_port=ui_port, ui=not headless)
    try:
        out.print(f"Temporal gRPC: {server.address}", highlight=False)
        out.print(f"Web UI:        {server.ui_url or 'none (headless)'}", highlight=False)
        out.print(f"database:      {server.db_file}", highlight=False)
        out.print("other `rollouts` commands use this server; Ctrl-C stops it", highlight=False)
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if _running_server() is None:
                out.print("the Temporal server exited", highlight=False)
                return 1
    finally:
        await asyncio.to_thread(stop_dev_server)
    return 0


async def run_worker(
    address: str | None,
    *,
    task_queue: str | None,
    host_queue: str | None,
    until_job: str | None,
    connect_timeout: float,
    out: Console,
    gc_every_s: float | None = None,
    max_concurrent: int | None = None,
) -> int:
    """Poll ``task_queue`` until Ctrl-C/SIGTERM (or, with ``until_job``, until that job closed),
    sweeping orphaned substrates every ``gc_every_s`` seconds (0 = never), with slots for
    ``max_concurrent`` rollouts in flight (``capacity.slots_for``). None: the settings'
    ``ROLLOUTS_TASK_QUEUE`` / ``ROLLOUTS_GC_EVERY``."""
    from ..capacity import slots_for
    from ..temporal.control import wait_closed
    from ..temporal.jobs import connect
    from ..worker import build_worker

    config = settings()
    task_queue = task_queue or config.task_queue
    if config.log_level:  # e.g. INFO: one line per removed orphan
        logging.basicConfig(level=config.log_level)
    client = await connect(address, connect_timeout)
    worker = build_worker(
        client,
        task_queue=task_queue,
        host_queue=host_queue,
        process_queue="auto",
        gc_every_s=config.gc_every if gc_every_s is None else gc_every_s,
        max_concurrent_activities=slots_for(max_concurrent),
    )
    stop = stop_event()
    async with worker:
        queues = ", ".join([task_queue, *worker.queues.extra])
        out.print(
            f"{WORKER_READY} queue={task_queue} ({queues}) on "
            f"{client.service_client.config.target_host}",
            highlight=False,
        )
        waiters = [asyncio.ensure_future(stop.wait())]
        if until_job is not None:
            waiters.append(asyncio.ensure_future(wait_closed(client, until_job)))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for fut in pending:
            fut.cancel()
        for fut in done:
            fut.result()
    if until_job is not None and not stop.is_set():
        out.print(f"job {until_job} has closed; worker exiting", highlight=False)
    return 0


async def collect_garbage(
    out: Console, *, dry_run: bool, job: str | None, temporal: str | None, connect_timeout: float
) -> int:
    """Remove substrates whose rollout is over (``durable_rollouts.gc``)."""
    import importlib.util

    from ..errors import ConfigError

    if importlib.util.find_spec("durable_rollouts.gc") is None:
        raise ConfigError("orphan collection is not available in this installation")
    from durable_rollouts import gc
    from durable_rollouts.temporal.jobs import connect

    client = None
    try:
        client = await connect(temporal, connect_timeout)
    except ConfigError as exc:
        out.print(f"warning: {exc}; only deadlines and dead processes count", highlight=False)
    prefix = "" if job is None else f"job-{job.removeprefix('job-')}"
    orphans = await gc.collect(client, dry_run=dry_run, prefix=prefix)
    out.print(gc.format_orphans(orphans, dry_run=dry_run), highlight=False)
    return 0 if dry_run or all(o.removed for o in orphans) else 1


def spawn_worker(address: str, task_queue: str, job_id: str) -> tuple[int, Path]:
    """Start a detached ``rollouts worker --until-job`` process; returns (pid, log file)."""
    folder = rollouts_home() / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{job_id}.log"
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]  # the agent's folder too (specs)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(paths + env.get("PYTHONPATH", "").split(os.pathsep))
    )
    with log.open("ab") as out:
        proc = subprocess.Popen(
            # -P: the worker imports exactly what this process imported (PYTHONPATH), not from its cwd
            [
                sys.executable,
                "-P",
                "-m",
                "durable_rollouts.cli",
                "worker",
                "--temporal",
                address,
                "--task-queue",
                task_queue,
                "--until-job",
                job_id,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc.pid, log
