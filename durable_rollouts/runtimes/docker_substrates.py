"""DockerRuntime's gc side: list the containers it labelled on this engine, force-remove one.

``DockerRuntime.list_substrates`` / ``reap`` call these (kept apart so ``docker.py`` stays the
placement logic). Imports the docker SDK lazily.
"""

from __future__ import annotations

import logging
import socket

from ..processes import pid_alive
from .base import Substrate
from .labels import LABEL_HOST, LABEL_KEY, LABEL_OWNER

__all__ = ["force_remove", "labelled_containers"]

log = logging.getLogger(__name__)

KIND = "docker"
_LIVE_STATES = ("running", "created", "restarting", "paused")


def labelled_containers() -> list[Substrate]:
    """Every container with a ``durable-rollouts.key`` label ([] when no engine answers)."""
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
        out.append(Substrate(
            KIND, labels, {"container": c.name, "id": c.id}, alive=c.status in _LIVE_STATES,
            owner_gone=labels.get(LABEL_HOST) == host and owner.isdigit() and not pid_alive(int(owner)),
        ))
    client.close()
    return out


def force_remove(container_id: str) -> None:
    """Remove the container and its volumes; gone already (or being removed) is success."""
    from docker.errors import APIError, NotFound

    import docker

    client = docker.from_env()
    try:
        client.containers.get(container_id).remove(force=True, v=True)
    except NotFound:
        pass
    except APIError as exc:  # "removal already in progress" is success too
        if exc.status_code != 409:
            raise
    finally:
        client.close()
