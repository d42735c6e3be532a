"""TEST-ONLY fault injection for crash tests: SIGKILL this worker at a named point, once.

Set ``ROLLOUTS_FAULTS`` to a comma-separated list of points (e.g. ``after_grade``) and
``ROLLOUTS_FAULTS_DIR`` to a directory. At a listed point the process SIGKILLs itself, after
creating the marker file ``<dir>/<point>.fired`` so that the fault fires only once across all
worker processes. Without both variables this module does nothing. Never set them in production.
Points (``activities/rollout.py``): ``after_provision``, ``after_connect``, ``after_start``,
``after_agent``, ``after_grade``, ``after_verify`` (the step did its work, its result is not
recorded yet), ``before_teardown`` (the substrate is still up) and ``after_teardown``.
Imports only the standard library.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["maybe_crash"]


def maybe_crash(point: str) -> None:
    """SIGKILL the current process if ``point`` is armed and has not fired yet."""
    armed = os.environ.get("ROLLOUTS_FAULTS", "")
    folder = os.environ.get("ROLLOUTS_FAULTS_DIR")
    if not armed or not folder or point not in {p.strip() for p in armed.split(",")}:
        return
    marker = Path(folder) / f"{point}.fired"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
