"""Which release of durable-rollouts is running: version, commit, and the names built from them.

Workers put ``release_name()`` in their Temporal identity, so a ``WorkflowTaskFailed`` event (for
example a non-determinism error after an upgrade) names the release of the worker that failed;
``start_job`` and ``rollouts resume`` record ``release_name()`` as the batch's ``rollouts_release``
memo, so the release that started a batch is known too (README: Upgrades). Pure:
no temporalio, no I/O beyond one ``git rev-parse`` when the package sits in a git checkout.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from .settings import settings, var

__all__ = ["COMMIT_ENV", "MEMO_KEY", "commit", "release_name", "version", "worker_identity"]

MEMO_KEY = "rollouts_release"
COMMIT_ENV = var("release_commit")
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def version() -> str:
    """The installed distribution's version (``0.0.0`` when not installed)."""
    try:
        return metadata.version("durable-rollouts")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@functools.cache
def commit() -> str:
    """Short commit of this code: ``$ROLLOUTS_RELEASE_COMMIT``, else git of a checkout, else ``dev``."""
    explicit = settings().release_commit
    if explicit:
        return explicit[:12]
    if not (_PACKAGE_ROOT / ".git").exists():  # an installed copy (site-packages): no git
        return "dev"
    try:
        out = subprocess.run(["git", "-C", str(_PACKAGE_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "dev"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "dev"


def release_name() -> str:
    """``durable-rollouts <version> (<commit or 'dev'>)``."""
    return f"durable-rollouts {version()} ({commit()})"


def worker_identity() -> str:
    """The Temporal worker identity: ``durable-rollouts <version> (<commit>) <pid>@<host>``."""
    return f"{release_name()} {os.getpid()}@{socket.gethostname()}"

