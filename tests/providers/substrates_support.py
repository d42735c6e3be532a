"""Shared helpers of the substrate tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_IMAGE_DIR = Path(__file__).resolve().parent / "envimage"
TEST_KEY_PREFIX = "pytest-substrate-"
KEY_LABEL = "durable-rollouts.key"


def containers_for(client: object, key: str) -> list[object]:
    """Every container (running or not) labelled with rollout ``key``."""
    return client.containers.list(all=True, filters={"label": f"{KEY_LABEL}={key}"})  # type: ignore[attr-defined]


def _agent_base():  # type: ignore[no-untyped-def]
    from durable_rollouts.sdk.agents import Agent

    return Agent


class MarkingSleepAgent(_agent_base()):  # type: ignore[misc]
    """Appends ``<pid> <rollout id>`` to ``marker`` when it starts, sleeps, then answers.

    Worker subprocesses import it as ``substrates_support:MarkingSleepAgent`` (the tests put this
    directory on their PYTHONPATH), so a test can SIGKILL a worker exactly mid-agent.
    """

    marker: str
    seconds: float = 3.0
    answer: str = ""

    async def __call__(self, run) -> None:  # type: ignore[no-untyped-def]
        import asyncio
        import os

        with open(self.marker, "a") as fh:
            fh.write(f"{os.getpid()} {run.rollout_id}\n")
        await asyncio.sleep(self.seconds)
        run.trace.content = self.answer


class LoopThread:
    """An event loop running in a daemon thread: the home of a test's stand-in servers, so
    blocking test code (or a provider's blocking gc listing) cannot stall them."""

    def __init__(self) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float = 30):  # type: ignore[no-untyped-def]
        """Run ``coro`` on the loop and return its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
