"""Gc candidates: every labelled substrate this host can see, with its liveness.

Docker containers are listed by their ``durable-rollouts.key`` label (:mod:`.labels`).
SubprocessRuntime children have no labels: their ``$ROLLOUTS_HOME/substrates/<key>/state.json``
(pid, pgid, birth) is read, the key is the directory name and the workflow id is derived from it.
Also holds the procfs checks that tell a live env server from a reused pid. Imports the docker
SDK lazily.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from durable_rollouts.sdk.labels import LABEL_HOST, LABEL_KEY, LABEL_OWNER, LABEL_WORKFLOW, workflow_for_key
from durable_rollouts.sdk.paths import rollouts_home
from durable_rollouts.sdk.procs import pid_alive, read_state

__all__ = ["substrates_dir"]

log = logging.getLogger(__name__)


@dataclass
class _Candidate:
    """One substrate found on this host, before it is judged."""

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



def _subprocess_candidates() -> list[_Candidate]:
    """SubprocessRuntime children. Their state has no labels: the key is the directory name
    (``safe_name(key)``, equal to the key for the ids this package makes) and the workflow id
    is derived from it (:func:`workflow_for_key`)."""
    out = []
    root = substrates_dir()
    for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
        state = read_state(path.parent)
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
    """Every labelled substrate on this host: containers, then SubprocessRuntime children."""
    return _docker_candidates() + _subprocess_candidates()
