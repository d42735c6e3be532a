"""Garbage collection of substrates whose rollout is over: ``rollouts gc [--dry-run]``.

Every substrate a provider places carries owner labels (:func:`owner_labels`): the rollout key,
the Rollout workflow id (``durable-rollouts.workflow``, taken from the Temporal activity that
provisions it, else derived from the key: durable keys are the workflow id plus ``-a<N>`` for a
retry attempt; direct-path keys name no workflow), the job id when it can be read from that
workflow id, the owning host and process, the run deadline and the Temporal server and namespace
of that activity (``durable-rollouts.temporal``). Docker containers carry them as labels;
SubprocessRuntime children have none: their ``$ROLLOUTS_HOME/substrates/<key>/state.json``
(pid, pgid, birth) is read and the workflow id derived from the key.

A substrate is an orphan when

* its run deadline (``limits.run_timeout_s``) has passed, or
* it is a SubprocessRuntime child whose process is already dead, or
* it names a workflow and Temporal says that workflow is closed or unknown (needs a client), or
* it names no workflow (direct path) and its owner process on this host is gone (a
  SubprocessRuntime child's owner is the Python process that spawned it: once that is gone the
  child is re-parented to init or a subreaper).

``cautious`` (the worker's background :func:`sweep`) never touches a substrate whose workflow is
running and leaves a container labelled with another Temporal server to that server's workers.
"Workflow not found" counts only for a container labelled with its own server, or once the owner
is gone: a substrate on this host (same Docker engine or ``$ROLLOUTS_HOME``) may belong to another
server. A deadline alone does not count there.

:func:`find_orphans` lists them; :func:`collect` removes them (or only lists with ``dry_run``),
re-checking each one right before removal (under the provider's lock for subprocess ones) and
dropping it from the result when it turned out to be in use again.
Imports the docker SDK and temporalio lazily; never imports workflows or activities. The CLI calls
:func:`gc` (``rollouts gc [--dry-run]``) and prints :func:`format_orphans`; the worker runs
:func:`sweep` (``rollouts worker --gc-every SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .paths import rollouts_home
from .procs import pid_alive

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "LABEL_DEADLINE",
    "LABEL_HOST",
    "LABEL_JOB",
    "LABEL_KEY",
    "LABEL_OWNER",
    "LABEL_TEMPORAL",
    "LABEL_WORKFLOW",
    "Orphan",
    "collect",
    "find_orphans",
    "format_orphans",
    "gc",
    "owner_labels",
    "substrates_dir",
    "sweep",
    "workflow_for_key",
]

log = logging.getLogger(__name__)

LABEL_KEY = "durable-rollouts.key"
LABEL_JOB = "durable-rollouts.job"
LABEL_WORKFLOW = "durable-rollouts.workflow"
LABEL_DEADLINE = "durable-rollouts.deadline"
LABEL_HOST = "durable-rollouts.host"
LABEL_OWNER = "durable-rollouts.owner"
LABEL_TEMPORAL = "durable-rollouts.temporal"

NOT_FOUND = "workflow not found"
FIRST_SWEEP_DELAY_S = 5.0  # the worker's first sweep: soon after start, not at once
LOCK_WAIT_S = 5.0  # a subprocess substrate locked longer than this is busy: skip it this time


def _current_workflow_id() -> str:
    """The id of the workflow whose activity is running this code ('' outside an activity)."""
    try:
        from temporalio import activity
    except ImportError:  # pragma: no cover - temporalio is a dependency
        return ""
    if not activity.in_activity():
        return ""
    return activity.info().workflow_id or ""


def _current_temporal() -> str:
    """``<server>/<namespace>`` of the activity running this code ('' outside an activity)."""
    try:
        from temporalio import activity

        return server_id(activity.client()) if activity.in_activity() else ""
    except Exception:  # noqa: BLE001 - no client in this activity: the label stays empty
        return ""


def server_id(client: Client) -> str:
    """``<target host>/<namespace>`` of a Temporal client (the ``LABEL_TEMPORAL`` value)."""
    return f"{client.service_client.config.target_host}/{client.namespace}"


def job_from_workflow_id(workflow_id: str, slug: str | None = None) -> str:
    """The job id in a Rollout workflow id ``job-<job_id>-<slug>-<group_index>`` ('' if none)."""
    if not workflow_id.startswith("job-"):
        return ""
    if slug:
        m = re.fullmatch(rf"job-(?P<job>.+)-{re.escape(slug)}-\d+(-b\d+)?", workflow_id)
        if m:
            return m.group("job")
    return ""


def workflow_for_key(key: str) -> str:
    """The Rollout workflow id a durable key belongs to ('' for direct/ad-hoc keys).

    Durable keys are the Rollout workflow id, plus ``-a<N>`` for a rollout's N-th attempt, then
    ``-v<N>`` for a verifier's N-th try and ``-verifier`` for a verifier's substrate.
    """
    if not key.startswith("job-"):
        return ""
    return re.sub(r"(-a\d+)?(-v\d+)?(-verifier)?$", "", key)


def owner_labels(
    key: str, *, slug: str | None = None, run_timeout_s: float | None = None
) -> dict[str, str]:
    """Labels that tie a substrate to its rollout (all values are strings, '' when unknown)."""
    workflow_id = _current_workflow_id() or workflow_for_key(key)
    job = job_from_workflow_id(workflow_id, slug) or job_from_workflow_id(key, slug)
    deadline = f"{time.time() + run_timeout_s:.0f}" if run_timeout_s else ""
    return {
        LABEL_KEY: key,
        LABEL_WORKFLOW: workflow_id,
        LABEL_JOB: job,
        LABEL_HOST: socket.gethostname(),
        LABEL_OWNER: str(os.getpid()),
        LABEL_DEADLINE: deadline,
        LABEL_TEMPORAL: _current_temporal(),
    }


@dataclass
class Orphan:
    """One substrate that outlived its rollout."""

    kind: Literal["docker", "subprocess"]
    key: str
    reason: str
    workflow_id: str = ""
    handle: dict[str, Any] = field(default_factory=dict)
    removed: bool = False


# ---------------------------------------------------------------------------------------------
# Candidates: every labelled substrate this host can see


@dataclass
class _Candidate:
    kind: Literal["docker", "subprocess"]
    labels: dict[str, str]
    handle: dict[str, Any]
    alive: bool
    owner_gone: bool = False


def _docker_candidates() -> list[_Candidate]:
    try:
        from docker.errors import DockerException

        import docker
    except ImportError:  # pragma: no cover - docker is a dependency
        return []
    try:
        client = docker.from_env()
        containers = client.containers.list(all=True, filters={"label": LABEL_KEY})
    except DockerException as exc:
        log.debug("gc: no Docker engine reachable (%s); skipping containers", exc)
        return []
    host = socket.gethostname()
    out = []
    for c in containers:
        labels = dict(c.labels)
        owner = labels.get(LABEL_OWNER, "")
        out.append(
            _Candidate(
                "docker",
                labels,
                {"container": c.name, "id": c.id},
                alive=c.status in ("running", "created", "restarting", "paused"),
                owner_gone=labels.get(LABEL_HOST) == host
                and owner.isdigit()
                and not pid_alive(int(owner)),
            )
        )
    client.close()
    return out


def substrates_dir() -> Path:
    """Where SubprocessRuntime keeps ``<safe key>/state.json`` per live child (H3's layout)."""
    return rollouts_home() / "substrates"


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None without one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _is_env_server(pid: int, birth: str | None) -> bool:
    """True when ``pid`` is still the env server of the state (so a reused pid is never killed)."""
    if not pid_alive(pid):
        return False
    fields = _stat(pid)
    if fields is None:
        return True  # no procfs: trust kill(0)
    if birth and len(fields) > 19 and fields[19] != birth:
        return False
    try:
        return b"durable_rollouts.envserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _spawner_gone(pid: int) -> bool:
    """True when the Python process that spawned env server ``pid`` has exited: the child was
    re-parented to init or a subreaper (not a Python process). False when it cannot tell."""
    fields = _stat(pid)
    if fields is None or len(fields) < 2:
        return False
    ppid = int(fields[1])
    if ppid <= 1:
        return True
    try:
        argv0 = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return not pid_alive(ppid)
    return b"python" not in os.path.basename(argv0)


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((directory / "state.json").read_text())
        int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def _subprocess_candidates() -> list[_Candidate]:
    """SubprocessRuntime children. Their state has no labels: the key is the directory name
    (``safe_name(key)``, equal to the key for the ids this package makes) and the workflow id
    is derived from it (:func:`workflow_for_key`)."""
    out = []
    root = substrates_dir()
    for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
        state = _read_state(path.parent)
        if state is None:
            continue
        pid = int(state["pid"])
        key = path.parent.name
        labels = {
            LABEL_KEY: key,
            LABEL_WORKFLOW: workflow_for_key(key),
            LABEL_HOST: socket.gethostname(),
        }
        alive = _is_env_server(pid, state.get("birth"))
        handle = {"pid": pid, "pgid": int(state.get("pgid") or pid), "dir": str(path.parent),
                  "birth": state.get("birth")}
        out.append(
            _Candidate("subprocess", labels, handle, alive=alive,
                       owner_gone=not alive or _spawner_gone(pid))
        )
    return out


def _candidates() -> list[_Candidate]:
    return _docker_candidates() + _subprocess_candidates()


async def _workflow_closed(client: Client, workflow_id: str) -> str | None:
    """Why the workflow no longer needs its substrate, or None while it is running."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    try:
        desc = await client.get_workflow_handle(workflow_id).describe(
            rpc_timeout=timedelta(seconds=10)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return NOT_FOUND
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    status = desc.status.name.lower() if desc.status is not None else "closed"
    return f"workflow {status}"


def _foreign(cand: _Candidate, client: Client) -> bool:
    """True when the substrate is labelled with another Temporal server or namespace."""
    server = cand.labels.get(LABEL_TEMPORAL, "")
    return bool(server) and server != server_id(client)


async def _reason(
    cand: _Candidate, workflow_id: str, client: Client | None, now: float, host: str
) -> str | None:
    """Why ``cand`` is an orphan under the rules of ``rollouts gc`` (None: it is not)."""
    deadline = cand.labels.get(LABEL_DEADLINE, "")
    if deadline and float(deadline) < now:
        return "run deadline passed"
    if cand.kind == "subprocess" and not cand.alive:
        return "process already dead"
    if workflow_id and client is not None:
        if _foreign(cand, client):
            return None  # another Temporal server's: this one cannot tell
        return await _workflow_closed(client, workflow_id)
    if not workflow_id and cand.labels.get(LABEL_HOST) == host and cand.owner_gone:
        return "owner process gone"
    return None


async def _cautious_reason(cand: _Candidate, workflow_id: str, client: Client | None) -> str | None:
    """The sweep's rules: a running workflow keeps its substrate whatever else holds; another
    server's container is left alone; an unknown workflow (maybe another server's) or none
    counts only once the owner is gone."""
    if client is not None and _foreign(cand, client):
        return None
    if workflow_id and client is not None:
        closed = await _workflow_closed(client, workflow_id)
        if closed != NOT_FOUND or cand.labels.get(LABEL_TEMPORAL):
            return closed  # None while running
    if cand.kind == "subprocess" and not cand.alive:
        return "process already dead"
    if cand.owner_gone:
        return f"{NOT_FOUND} and owner process gone" if workflow_id else "owner process gone"
    return None


async def find_orphans(
    client: Client | None = None,
    *,
    prefix: str = "",
    now: float | None = None,
    cautious: bool = False,
) -> list[Orphan]:
    """Every labelled substrate on this host that outlived its rollout (see the module docstring).

    Args:
        client: a Temporal client used to ask whether each substrate's Rollout workflow is
            closed; without one only deadlines and dead owner processes count.
        prefix: only substrates whose rollout key starts with this (e.g. ``job-<id>``).
        now: the current time (tests).
        cautious: the background sweep's stricter rules (module docstring).
    """
    now = time.time() if now is None else now
    host = socket.gethostname()
    candidates = await asyncio.to_thread(_candidates)
    orphans: list[Orphan] = []
    for cand in candidates:
        key = cand.labels.get(LABEL_KEY, "")
        if not key.startswith(prefix):
            continue
        workflow_id = cand.labels.get(LABEL_WORKFLOW, "") or workflow_for_key(key)
        if cautious:
            reason = await _cautious_reason(cand, workflow_id, client)
        else:
            reason = await _reason(cand, workflow_id, client, now, host)
        if reason is not None:
            orphans.append(Orphan(cand.kind, key, reason, workflow_id, dict(cand.handle)))
    return orphans


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
        state = _read_state(Path(orphan.handle["dir"]))
        if state is None or int(state["pid"]) != int(orphan.handle["pid"]):
            return False
    asked = cautious or orphan.reason.startswith("workflow ")
    if orphan.workflow_id and client is not None and asked:
        return await _workflow_closed(client, orphan.workflow_id) is not None
    return True


async def _remove_checked(orphan: Orphan, client: Client | None, cautious: bool) -> bool:
    """Remove ``orphan`` if it still is one; False when it turned out to be in use again."""
    if orphan.kind == "docker":
        if not await _still_orphan(orphan, client, cautious):
            return False
        await asyncio.to_thread(_remove, orphan)
        return True
    async with _locked(Path(orphan.handle["dir"])) as held:
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
        cautious: the background sweep's stricter rules (module docstring).

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


async def gc(temporal: Any = None, *, dry_run: bool = False, prefix: str = "") -> list[Orphan]:
    """What ``rollouts gc [--dry-run]`` runs: :func:`collect` with a Temporal client.

    Args:
        temporal: a Temporal ``Client``, an address, or None (``$ROLLOUTS_TEMPORAL_ADDRESS``,
            else the embedded dev server, which holds the workflows of embedded runs).
        dry_run: only list what would be removed.
        prefix: only substrates whose rollout key starts with this.
    """
    from temporalio.client import Client as _Client

    from .temporal import connect_client

    client = temporal if isinstance(temporal, _Client) else await connect_client(temporal)
    return await collect(client, dry_run=dry_run, prefix=prefix)


async def sweep(client: Client, every_s: float, *, first_delay_s: float | None = None) -> None:
    """Collect orphans (``cautious``) every ``every_s`` seconds until cancelled: the worker's gc.

    The first sweep runs after ``first_delay_s`` (default ``min(every_s, 5)``). Never raises:
    a failed sweep is one warning and the next one runs on time. Logs one INFO line per
    removed orphan. ``every_s`` of 0 (or infinite) returns at once.
    """
    if not 0 < every_s < float("inf"):
        return
    delay = min(every_s, FIRST_SWEEP_DELAY_S) if first_delay_s is None else first_delay_s
    while True:
        await asyncio.sleep(delay)
        delay = every_s
        try:
            orphans = await collect(client, cautious=True)
        except Exception as exc:  # noqa: BLE001 - the sweep must never end the worker
            log.warning("gc sweep failed (next in %gs): %s: %s", every_s, type(exc).__name__, exc)
            continue
        for orphan in orphans:
            if orphan.removed:
                log.info("gc: %s", _line(orphan, "removed"))


def _line(o: Orphan, verb: str) -> str:
    where = o.handle.get("container") or f"pid {o.handle.get('pid')}"
    return f"{verb} {o.kind} {where} (key {o.key}): {o.reason}"


def format_orphans(orphans: list[Orphan], *, dry_run: bool = False) -> str:
    """One line per orphan, for the CLI."""
    if not orphans:
        return "no orphaned substrates"
    verb = "would remove" if dry_run else "removed"
    return "\n".join(_line(o, verb if (dry_run or o.removed) else "FAILED to remove") for o in orphans)
