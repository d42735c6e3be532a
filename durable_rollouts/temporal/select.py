"""Which rollouts a resume re-runs: pure selection over runs, keyed by stable rollout ids.

A run is selected by what happened to it (its status, or ``ungraded``: no valid reward), never
by comparing configs. Imports nothing with I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError

__all__ = ["SELECTORS", "parse_only", "selected"]

SELECTORS = ("failed", "errored", "cancelled", "timeout", "ungraded")
"""``--only`` values: a rollout status, or ``ungraded`` (finished without a valid grade)."""


def parse_only(values: Iterable[str] | None) -> frozenset[str] | None:
    """``--only`` values (repeatable or comma-separated) as a set; None selects every unsuccessful run."""
    chosen: set[str] = set()
    for value in values or ():
        for part in value.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part == "canceled":
                part = "cancelled"
            if part not in SELECTORS:
                raise ConfigError(f"--only {part!r}: use one or more of {', '.join(SELECTORS)}")
            chosen.add(part)
    return frozenset(chosen) or None


def _matches(run: Any, only: frozenset[str] | None) -> bool:
    if only is None:
        return run.status != "succeeded"
    if run.status in only:
        return True
    return "ungraded" in only and run.grade_reward is None  # no valid grade at all


def selected(runs: Iterable[Any], only: frozenset[str] | None) -> list[Any]:
    """The runs to re-run: by default every run that did not succeed, else those ``only`` names.

    Runs still in flight (``running``/``cancelling``) are never selected.
    """
    return [
        r
        for r in runs
        if r.status not in ("running", "cancelling", "pending") and _matches(r, only)
    ]
