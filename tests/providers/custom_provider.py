"""A provider of the user's own (``module:Class`` spec), for the card-shape test of a registered runtime.

It places the env as a subprocess through the built-in runtime and counts its acquires and
releases on disk, so the test sees that the workflow's provision and teardown steps called it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from durable_rollouts.models import Endpoint, ProviderSpec, Task
from durable_rollouts.runtimes import SubprocessRuntime

__all__ = ["CountingProvider"]


class CountingProvider(SubprocessRuntime):
    """``SubprocessRuntime`` that logs ``acquire <key>`` / ``release <key>`` lines to ``log``."""

    kind: ClassVar[str] = "custom_provider:CountingProvider"

    def __init__(self, *args: Any, log: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def spec(self) -> ProviderSpec:
        base = super().spec()
        return ProviderSpec(kind=self.kind, options={**base.options, "log": self.log})

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> CountingProvider:
        options = dict(options)
        log = options.pop("log", "")
        built = super().from_options(options)  # a CountingProvider: cls(...) there
        built.log = log  # type: ignore[attr-defined]
        return built  # type: ignore[return-value]

    def _note(self, line: str) -> None:
        with Path(self.log).open("a") as fh:
            fh.write(line + "\n")

    async def acquire(self, task: Task, key: str) -> Endpoint:
        self._note(f"acquire {key}")
        return await super().acquire(task, key)

    async def release(self, endpoint: Endpoint) -> None:
        self._note(f"release {endpoint.key}")
        await super().release(endpoint)
