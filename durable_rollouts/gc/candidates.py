"""Gc candidates: every substrate this host's providers can see, with its liveness.

Generic over providers: each provider class lists its own substrates
(``DurableProvider.list_substrates``: Docker containers by label, SubprocessRuntime children by
their ``state.json``), so this module knows no provider's internals.
"""

from __future__ import annotations

import logging

from durable_rollouts.runtimes import provider_classes
from durable_rollouts.runtimes.base import Substrate

__all__: list[str] = []

log = logging.getLogger(__name__)

_Candidate = Substrate  # the name the gc modules (and tests) use for one


def _candidates() -> list[Substrate]:
    """Every substrate on this host, provider by provider (containers, then env processes)."""
    return [sub for cls in provider_classes() for sub in cls.list_substrates()]
