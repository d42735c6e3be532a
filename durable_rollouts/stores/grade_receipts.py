"""Grade receipts: every grade a durable grade step received, kept on this host for a while.

A Rollout's grade and teardown may run as local activities in one workflow task, and a local
activity reaches the history only when its task completes. A worker that dies after the teardown
but before that leaves a history without the grade; the next worker replays the grade against a
torn-down environment. Without a receipt that looks like a dead substrate, and the rollout would
run again (the agent twice, the environment grading twice). With one, the replayed grade step
returns what the environment said the first time, at the cost of one appended line per grade and
no extra round trip to the Temporal server.

Receipts live under ``$ROLLOUTS_HOME/grades/<UTC day>/<shard>.jsonl``, one JSON line each, keyed
by the substrate key and the session id (a fresh random id per session, so a later rollout that
reuses a workflow id never reads an earlier one's grade). Lines are appended with one ``write``
on an ``O_APPEND`` descriptor, so processes on one host share the files. Days older than
``KEEP_DAYS`` are removed when a new day's folder is made. A replay on another host finds no
receipt and the rollout runs again, as before. Imports only the standard library and the models.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..models import Grade
from ..paths import rollouts_home

__all__ = ["KEEP_DAYS", "find", "keep"]

KEEP_DAYS = 3  # a replay later than this (no worker for days) runs the rollout again
_SHARDS = 64
_warned = False  # the warning of a home that cannot be written: once per process
log = logging.getLogger(__name__)


def _root() -> Path:
    return rollouts_home() / "grades"


def _shard(key: str) -> str:
    digest = hashlib.blake2b(key.encode(), digest_size=2).digest()
    return f"{int.from_bytes(digest, 'big') % _SHARDS:02d}.jsonl"


def _day(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d")


def keep(key: str, session_id: str, grade: Grade, *, now: datetime | None = None) -> bool:
    """Append the receipt of ``grade`` for the session ``session_id`` of substrate ``key``.

    Best effort: a home that cannot be written (read-only, full) logs one warning per process
    and returns False; the grade itself stands (only a later crash could have used it)."""
    global _warned
    try:
        folder = _root() / _day(now)
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _prune(now or datetime.now(timezone.utc))
        receipt = {"key": key, "session": session_id, "grade": grade.model_dump(mode="json")}
        line = json.dumps(receipt, separators=(",", ":")) + "\n"
        fd = os.open(folder / _shard(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("grade receipts are not kept (%s): a worker dying right after a grade "
                        "may run that rollout again", exc)
        return False
    return True


def find(key: str, session_id: str) -> Grade | None:
    """The newest receipt for ``session_id`` of substrate ``key``, or None."""
    root = _root()
    if not root.is_dir():
        return None
    needle = json.dumps(key)
    for day in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True):
        path = day / _shard(key)
        if not path.is_file():
            continue
        found: Grade | None = None
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if needle not in line:
                    continue
                with contextlib.suppress(ValueError):
                    receipt = json.loads(line)
                    if receipt.get("key") == key and receipt.get("session") == session_id:
                        found = Grade.model_validate(receipt["grade"])
        if found is not None:
            return found
    return None


def _prune(now: datetime) -> None:
    """Remove the days older than ``KEEP_DAYS`` (best effort: another process may race)."""
    oldest = _day(now - timedelta(days=KEEP_DAYS - 1))
    for day in _root().iterdir():
        if day.is_dir() and day.name < oldest:
            shutil.rmtree(day, ignore_errors=True)
