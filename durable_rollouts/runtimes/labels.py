"""Owner labels that tie a substrate to its rollout, and the workflow id a rollout key names.

Every substrate a provider places carries :func:`owner_labels`: the rollout key, the Rollout
workflow id (``durable-rollouts.workflow``, taken from the Temporal activity that provisions it,
else derived from the key by :func:`workflow_for_key`: durable keys are the workflow id plus
``-a<N>`` for a retry attempt; direct-path keys name no workflow), the job id when it can be read
from that workflow id, the owning host and process, the run deadline and the Temporal server and
namespace of that activity (``durable-rollouts.temporal``, see :func:`server_id`).

Temporal-free: the activity layer says which workflow and server it runs for by setting
:data:`current_owner` around each activity (``activities.owner.OwnerInterceptor``).
"""

from __future__ import annotations

import os
import re
import socket
import time
from contextvars import ContextVar
from typing import Any

__all__ = [
    "LABEL_DEADLINE",
    "LABEL_HOST",
    "LABEL_JOB",
    "LABEL_KEY",
    "LABEL_OWNER",
    "LABEL_TEMPORAL",
    "LABEL_WORKFLOW",
    "job_from_workflow_id",
    "owner_labels",
    "current_owner",
    "server_id",
    "workflow_for_key",
]

LABEL_KEY = "durable-rollouts.key"
LABEL_JOB = "durable-rollouts.job"
LABEL_WORKFLOW = "durable-rollouts.workflow"
LABEL_DEADLINE = "durable-rollouts.deadline"
LABEL_HOST = "durable-rollouts.host"
LABEL_OWNER = "durable-rollouts.owner"
LABEL_TEMPORAL = "durable-rollouts.temporal"


# (workflow id, ``<server>/<namespace>``) of the activity running this code; ('', '') outside one.
current_owner: ContextVar[tuple[str, str]] = ContextVar("rollouts_substrate_owner", default=("", ""))


def server_id(client: Any) -> str:
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
    owner_workflow, owner_server = current_owner.get()
    workflow_id = owner_workflow or workflow_for_key(key)
    job = job_from_workflow_id(workflow_id, slug) or job_from_workflow_id(key, slug)
    deadline = f"{time.time() + run_timeout_s:.0f}" if run_timeout_s else ""
    return {
        LABEL_KEY: key,
        LABEL_WORKFLOW: workflow_id,
        LABEL_JOB: job,
        LABEL_HOST: socket.gethostname(),
        LABEL_OWNER: str(os.getpid()),
        LABEL_DEADLINE: deadline,
        LABEL_TEMPORAL: owner_server,
    }
