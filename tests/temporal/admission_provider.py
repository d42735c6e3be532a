"""A provider that counts its live substrates on disk, for the fleet-wide admission tests.

``LiveCounter`` hands every rollout the one env server the test started (``url``) and records,
under an exclusive lock, ``+ <key> <pid> <time>`` when a create begins and ``- <key> <pid> <time>``
once a removal is done: the log's order is the true order across every worker process, so
:func:`max_live` is the most substrates that could have been alive at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from durable_rollouts.models import Endpoint, ProviderSpec, Task
from durable_rollouts.runtimes.base import DurableProvider, Locality

__all__ = ["LiveCounter", "max_live"]


class LiveCounter(DurableProvider):
    """Every substrate is the shared server at ``url``; a create takes ``create_s`` seconds."""

    kind: ClassVar[str] = "admission_provider:LiveCounter"
    locality: ClassVar[Locality] = "global"

    def __init__(self, url: str, log: str, create_s: float = 0.2, *,
                 max_provisions_per_s: float | None = None, max_substrates: int | None = None) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.url, self.log, self.create_s = url, log, create_s

    def spec(self) -> ProviderSpec:
        return ProviderSpec(kind=self.kind, options={"url": self.url, "log": self.log,
                                                     "create_s": self.create_s})

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> LiveCounter:
        return cls(options["url"], options["log"], float(options["create_s"]))

    def _note(self, sign: str, key: str) -> None:
        with open(self.log, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(f"{sign} {key} {os.getpid()} {time.time():.6f}\n")

    async def acquire(self, task: Task, key: str) -> Endpoint:
        self._note("+", key)
        await asyncio.sleep(self.create_s)
        return Endpoint(url=self.url, provider=self.spec(), key=key)

    async def release(self, endpoint: Endpoint) -> None:
        await asyncio.sleep(0.05)
        self._note("-", endpoint.key)


def max_live(log: Path) -> tuple[int, int]:
    """(the most substrates alive at once, how many are alive at the end) from the log."""
    live: set[str] = set()
    most = 0
    for line in log.read_text().splitlines():
        sign, key = line.split()[:2]
        if sign == "+":
            live.add(key)
        else:
            live.discard(key)
        most = max(most, len(live))
    return most, len(live)
