"""Removing orphans (:func:`collect`): containers force-removed, process groups killed.

Each orphan is re-checked right before removal (under SubprocessRuntime's lock for subprocess
ones) and dropped from the result when it turned out to be in use again. Imports the docker SDK
lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from durable_rollouts.gc.candidates import _is_env_server
from durable_rollouts.gc.orphans import Orphan, _workflow_closed, find_orphans
from durable_rollouts.sdk.procs import read_state

Client = Any  # a temporalio Client

__all__ = ["LOCK_WAIT_S", "collect"]

log = logging.getLogger(__name__)

LOCK_WAIT_S = 5.0  # a subprocess substrate locked longer than this is busy: skip it this time


def _remove(orphan: Orphan) -> None:
    if orphan.kind == "docker":
        from docker.errors import APIError, NotFound

        import docker

        client = docker.from_env()
        try:
            client.containers.get(orphan.handle["id"]).remove(force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:  # "removal already in progress" is success too
            if exc.status_code != 409:
                raise
        finally:
            client.close()
    else:
        pid = int(orphan.handle["pid"])
        pgid = int(orphan.handle.get("pgid") or pid)
        if _is_env_server(pid, orphan.handle.get("birth")):
            try:
                if pgid > 1 and pgid != os.getpgrp():
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(orphan.handle["dir"], ignore_errors=True)
    orphan.removed = True


@contextlib.asynccontextmanager
async def _locked(directory: Path) -> AsyncIterator[bool]:
    """Hold SubprocessRuntime's lock of ``directory`` (yields False when gone or busy)."""
    try:
        fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                await asyncio.sleep(0.05)
        yield True
    finally:
        os.close(fd)


async def _still_orphan(orphan: Orphan, client: Client | None, cautious: bool) -> bool:
    """Re-check just before removal: the substrate was not replaced and its workflow not
    (re)started meanwhile (e.g. a resumed rollout reusing a live substrate by key)."""
    if orphan.kind == "subprocess":
        state = read_state(Path(orphan.handle["dir"]))
        if state is None or int(state["pid"]) != int(orphan.handle["pid"]):
            return False
    asked = cautious or orphan.reason.startswith("workflow ")
    if orphan.workflow_id and client is not None and asked:
        return await _workflow_closed(client, orphan.workflow_id) is not None
    return True


async def _remove_checked(orphan: Orphan, client: Client | None, cautious: bool) -> bool:
    """Remove ``orphan`` if it still is one; False when it turned out to be in use again."""
    lock: contextlib.AbstractAsyncContextManager[bool]
    if orphan.kind == "docker":
        lock = contextlib.nullcontext(True)  # containers have no lock
    else:
        lock = _locked(Path(orphan.handle["dir"]))
    async with lock as held:
        if not held or not await _still_orphan(orphan, client, cautious):
            return False  # released meanwhile, or the provider is busy with it
        await asyncio.to_thread(_remove, orphan)
        return True


async def collect(
    client: Client | None = None,
    *,
    dry_run: bool = False,
    prefix: str = "",
    cautious: bool = False,
) -> list[Orphan]:
    """Find orphans and remove them (containers force-removed, process groups killed).

    Args:
        client: Temporal client for the workflow check (see :func:`find_orphans`).
        dry_run: only list what would be removed.
        prefix: only substrates whose rollout key starts with this.
        cautious: the background sweep's stricter rules (:mod:`.orphans`).

    Returns:
        The orphans found (less those in use again by the time of removal); ``removed`` is
        True for each one that was removed.
    """
    orphans = await find_orphans(client, prefix=prefix, cautious=cautious)
    if dry_run:
        return orphans
    kept = []
    for orphan in orphans:
        try:
            if await _remove_checked(orphan, client, cautious):
                kept.append(orphan)
        except Exception as exc:  # noqa: BLE001 - one stuck substrate must not stop the rest
            log.warning("gc: could not remove %s %s: %s", orphan.kind, orphan.key, exc)
            kept.append(orphan)
    return kept
