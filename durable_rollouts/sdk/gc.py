"""Garbage collection of substrates whose rollout is over: ``rollouts gc [--dry-run]``.

Every substrate a provider places carries owner labels (:func:`owner_labels`): the rollout key,
the Rollout workflow id (``durable-rollouts.workflow``, taken from the Temporal activity that
provisions it, else derived from the key: durable keys are the workflow id plus ``-a<N>`` for a
retry attempt; direct-path keys name no workflow), the job id when it can be read from that
workflow id, the owning host and process, and the run deadline. Docker containers carry them as
labels; SubprocessRuntime children have none: their ``$ROLLOUTS_HOME/substrates/<key>/state.json``
(pid, pgid) is read and the workflow id derived from the key.

A substrate is an orphan when

* its run deadline (``limits.run_timeout_s``) has passed, or
* it is a SubprocessRuntime child whose process is already dead, or
* it names a workflow and Temporal says that workflow is closed or unknown (needs a client), or
* it names no workflow (direct path) and its owner process on this host is gone.

:func:`find_orphans` lists them; :func:`collect` removes them (or only lists with ``dry_run``).
Imports the docker SDK and temporalio lazily; never imports workflows or activities. The CLI calls
:func:`gc` (``rollouts gc [--dry-run]``) and prints :func:`format_orphans`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .procs import pid_alive
from .paths import rollouts_home

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "LABEL_DEADLINE",
    "LABEL_HOST",
    "LABEL_JOB",
    "LABEL_KEY",
    "LABEL_OWNER",
    "LABEL_WORKFLOW",
    "Orphan",
    "collect",
    "find_orphans",
    "format_orphans",
    "gc",
    "owner_labels",
    "substrates_dir",
    "workflow_for_key",
]

log = logging.getLogger(__name__)

LABEL_KEY = "durable-rollouts.key"
LABEL_JOB = "durable-rollouts.job"
LABEL_WORKFLOW = "durable-rollouts.workflow"
LABEL_DEADLINE = "durable-rollouts.deadline"
LABEL_HOST = "durable-rollouts.host"
LABEL_OWNER = "durable-rollouts.owner"


def _current_workflow_id() -> str:
    """The id of the workflow whose activity is running this code ('' outside an activity)."""
    try:
        from temporalio import activity
    except ImportError:  # pragma: no cover - temporalio is a dependency
        return ""
    if not activity.in_activity():
        return ""
    return activity.info().workflow_id or ""


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

    Durable keys are the Rollout workflow id, plus ``-a<N>`` for a rollout's N-th attempt.
    """
    if not key.startswith("job-"):
        return ""
    return re.sub(r"-a\d+$", "", key)


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


def _docker_candidates() -> list[_Candidate]:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:  # pragma: no cover - docker is a dependency
        return []
    try:
        client = docker.from_env()
        containers = client.containers.list(all=True, filters={"label": LABEL_KEY})
    except DockerException as exc:
        log.debug("gc: no Docker engine reachable (%s); skipping containers", exc)
        return []
    out = []
    for c in containers:
        out.append(
            _Candidate(
                "docker",
                dict(c.labels),
                {"container": c.name, "id": c.id},
                alive=c.status in ("running", "created", "restarting", "paused"),
            )
        )
    client.close()
    return out


def substrates_dir() -> Path:
    """Where SubprocessRuntime keeps ``<safe key>/state.json`` per live child (H3's layout)."""
    return rollouts_home() / "substrates"


def _subprocess_candidates() -> list[_Candidate]:
    """SubprocessRuntime children. Their state has no labels: the key is the directory name
    (``safe_name(key)``, equal to the key for the ids this package makes) and the workflow id
    is derived from it (:func:`workflow_for_key`)."""
    out = []
    root = substrates_dir()
    for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
        try:
            state = json.loads(path.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        key = path.parent.name
        labels = {
            LABEL_KEY: key,
            LABEL_WORKFLOW: workflow_for_key(key),
            LABEL_HOST: socket.gethostname(),
        }
        out.append(
            _Candidate(
                "subprocess",
                labels,
                {"pid": pid, "pgid": int(state.get("pgid") or pid), "dir": str(path.parent)},
                alive=pid_alive(pid),
            )
        )
    return out


async def _workflow_closed(client: Client, workflow_id: str) -> str | None:
    """Why the workflow no longer needs its substrate, or None while it is running."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return "workflow not found"
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    status = desc.status.name.lower() if desc.status is not None else "closed"
    return f"workflow {status}"


async def find_orphans(
    client: Client | None = None, *, prefix: str = "", now: float | None = None
) -> list[Orphan]:
    """Every labelled substrate on this host that outlived its rollout (see the module docstring).

    Args:
        client: a Temporal client used to ask whether each substrate's Rollout workflow is
            closed; without one only deadlines and dead owner processes count.
        prefix: only substrates whose rollout key starts with this (e.g. ``job-<id>``).
        now: the current time (tests).
    """
    now = time.time() if now is None else now
    host = socket.gethostname()
    candidates = await asyncio.to_thread(_docker_candidates) + _subprocess_candidates()
    orphans: list[Orphan] = []
    for cand in candidates:
        labels = cand.labels
        key = labels.get(LABEL_KEY, "")
        if not key.startswith(prefix):
            continue
        workflow_id = labels.get(LABEL_WORKFLOW, "") or workflow_for_key(key)
        reason: str | None = None
        deadline = labels.get(LABEL_DEADLINE, "")
        if deadline and float(deadline) < now:
            reason = "run deadline passed"
        elif cand.kind == "subprocess" and not cand.alive:
            reason = "process already dead"
        elif workflow_id and client is not None:
            reason = await _workflow_closed(client, workflow_id)
        elif not workflow_id and labels.get(LABEL_HOST) == host:
            owner = labels.get(LABEL_OWNER, "")
            if owner.isdigit() and not pid_alive(int(owner)):
                reason = "owner process gone"
        if reason is not None:
            orphans.append(Orphan(cand.kind, key, reason, workflow_id, dict(cand.handle)))
    return orphans


def _remove(orphan: Orphan) -> None:
    if orphan.kind == "docker":
        import docker
        from docker.errors import APIError, NotFound

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
        if pid_alive(pid):
            try:
                if pgid > 1 and pgid != os.getpgrp():
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(orphan.handle["dir"], ignore_errors=True)
    orphan.removed = True


async def collect(
    client: Client | None = None, *, dry_run: bool = False, prefix: str = ""
) -> list[Orphan]:
    """Find orphans and remove them (containers force-removed, process groups killed).

    Args:
        client: Temporal client for the workflow check (see :func:`find_orphans`).
        dry_run: only list what would be removed.
        prefix: only substrates whose rollout key starts with this.

    Returns:
        The orphans found; ``removed`` is True for each one that was removed.
    """
    orphans = await find_orphans(client, prefix=prefix)
    if not dry_run:
        for orphan in orphans:
            try:
                await asyncio.to_thread(_remove, orphan)
            except Exception as exc:  # one stuck substrate must not stop the rest
                log.warning("gc: could not remove %s %s: %s", orphan.kind, orphan.key, exc)
    return orphans


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


def format_orphans(orphans: list[Orphan], *, dry_run: bool = False) -> str:
    """One line per orphan, for the CLI."""
    if not orphans:
        return "no orphaned substrates"
    verb = "would remove" if dry_run else "removed"
    lines = []
    for o in orphans:
        where = o.handle.get("container") or f"pid {o.handle.get('pid')}"
        done = verb if (dry_run or o.removed) else "FAILED to remove"
        lines.append(f"{done} {o.kind} {where} (key {o.key}): {o.reason}")
    return "\n".join(lines)
