"""Frozen: the merged steps earlier releases' Rollouts schedule (layouts 1-4, ``workflows.legacy``).

A Rollout an earlier release started keeps its shape when this release's workers finish it, so
its merged activities must still run here: ``rollouts.open`` (provision -> connect -> start),
``rollouts.grade_teardown`` (grade -> teardown), and the agent step that grades and tears down
its substrate (``AgentInput.close``, layout 3) or also opens it (``AgentInput.open``, layout 4).
A layout-4 agent step owns its substrate (the workflow never learns the endpoint): a retryable
failure parks it in this process for the step's retry (``ParkedSubstrates``, released after
``PARK_TTL_S`` unclaimed), a retry elsewhere after a checkpoint reports the substrate gone.
New Rollouts run the card's steps (``rollout``) and never reach this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from temporalio import activity

from durable_rollouts.activities import legacy_steps as merged_steps
from durable_rollouts.activities.checkpoints import AgentCheckpoints
from durable_rollouts.activities.failures import map_errors, map_step_errors
from durable_rollouts.errors import ConfigError, ModelAPIError, SubstrateGoneError
from durable_rollouts.models import Endpoint, Grade
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.run import Run
from durable_rollouts.step_io import AgentInput, AgentResult, GradeInput, Opened, ProvisionInput
from durable_rollouts.steps import agent as agent_step
from durable_rollouts.steps import substrate as steps
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.workflows.types import ACT_CLOSE, ACT_OPEN

__all__ = ["PARKED", "LegacySteps", "ParkedSubstrates"]

log = logging.getLogger(__name__)

# Longer than the agent step's retry backoff (at most 30 s between attempts, or a model API's
# Retry-After), short enough that an unclaimed substrate does not linger.
PARK_TTL_S = 300.0


async def release_quietly(opened: Opened) -> None:
    """End the session and release the substrate, best effort (a failure is only logged)."""
    try:
        await steps.teardown_with(opened.endpoint, opened.session,
                                  provider_from_spec(opened.endpoint.provider))
    except Exception as exc:  # noqa: BLE001 - nothing is left to report it to
        log.warning("teardown of %s failed: %s", opened.endpoint.key, exc)


class ParkedSubstrates:
    """Opened substrates by key, each torn down if not claimed within ``ttl_s``."""

    def __init__(self, ttl_s: float = PARK_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._parked: dict[str, tuple[Opened, asyncio.TimerHandle]] = {}
        self._expiring: set[asyncio.Task[None]] = set()

    def park(self, key: str, opened: Opened) -> None:
        """Keep ``opened`` for the next attempt of its step (replaces an older entry's timer)."""
        self.claim(key)
        timer = asyncio.get_running_loop().call_later(self.ttl_s, self._expire, key)
        self._parked[key] = (opened, timer)

    def claim(self, key: str) -> Opened | None:
        """The substrate parked under ``key`` (now the caller's), or None."""
        entry = self._parked.pop(key, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]

    def _expire(self, key: str) -> None:
        opened = self.claim(key)
        if opened is None:
            return
        log.info("releasing %s: no retry of its agent step claimed it in %.0f s", key, self.ttl_s)
        task = asyncio.get_running_loop().create_task(release_quietly(opened))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)


PARKED = ParkedSubstrates()


def _handed_back(result: AgentResult, opened: Opened) -> AgentResult:
    """``result`` of a one-step rollout, with its substrate when it is not graded (so still up):
    the workflow's close step then grades it and tears it down."""
    return result if result.grade is not None else result.model_copy(update={"opened": opened})


T = TypeVar("T")


class StepHost(Protocol):
    """What the merged steps use of the card's activities (``rollout.RolloutActivities``)."""

    trace_store: TraceStore

    def pin(self, endpoint: Endpoint, provider: Any) -> Endpoint: ...

    def beating(self, step: Awaitable[T],
                details: Callable[[], tuple[Any, ...]] | None = None) -> Awaitable[T]: ...

    def last_attempt(self) -> bool: ...


class LegacySteps:
    """The merged activities, on the same worker dependencies as the card's steps (``owner``)."""

    def __init__(self, owner: StepHost) -> None:
        self.owner = owner

    def all(self) -> list[Any]:
        return [self.open, self.grade_teardown]

    @activity.defn(name=ACT_OPEN)
    async def open(self, inp: ProvisionInput) -> Opened:
        """provision -> connect -> start in one step (a fast local substrate)."""
        provider = provider_from_spec(inp.provider)
        with map_step_errors():
            opened = await self.owner.beating(merged_steps.open_rollout(inp.task, inp.key, provider))
        self.owner.pin(opened.endpoint, provider)
        return opened

    @activity.defn(name=ACT_CLOSE)
    async def grade_teardown(self, inp: GradeInput) -> Grade:
        """grade -> teardown in one step (a substrate that dies with its worker)."""
        with map_errors():
            return await self.owner.beating(merged_steps.close_rollout(inp))

    async def agent(self, inp: AgentInput) -> AgentResult:
        """The agent step of layout 3 (``close``: grade and tear down after the agent, over its
        channel) or layout 4 (``open``: open the substrate first, too)."""
        owner = self.owner
        with map_errors():
            checkpoints = AgentCheckpoints(inp)
            inp = await owner.beating(checkpoints.restore(inp), checkpoints.details)
            last = owner.last_attempt()
            if inp.open is not None:
                return await self._open_and_run(inp, checkpoints, last)
            return await owner.beating(
                agent_step.run_agent(inp, agent=load_agent(inp.agent), new_run=Run.for_step,
                                     trace_store=owner.trace_store, checkpointer=checkpoints.save,
                                     last_attempt=last, after=_closer(inp)),
                checkpoints.details)

    async def _open_and_run(self, inp: AgentInput, checkpoints: AgentCheckpoints,
                            last: bool) -> AgentResult:
        assert inp.open is not None
        owner = self.owner
        agent = load_agent(inp.agent)  # a ConfigError before anything is opened
        opened, client = PARKED.claim(inp.open.key), None
        if opened is None:
            if inp.checkpoint is not None:  # the session it checkpointed lived in another process
                raise SubstrateGoneError(f"substrate {inp.open.key} is gone with the worker of an "
                                         "earlier attempt")
            with map_step_errors():  # the agent then works on the connection that started it
                opened, client = await owner.beating(merged_steps.open_channel(
                    inp.task, inp.open.key, provider_from_spec(inp.open.provider)), checkpoints.details)
        on = inp.on(opened)
        try:
            result = await owner.beating(
                agent_step.run_agent(on, agent=agent, new_run=Run.for_step,
                                     trace_store=owner.trace_store, checkpointer=checkpoints.save,
                                     last_attempt=last, client=client, after=_closer(on)),
                checkpoints.details)
        except (asyncio.CancelledError, SubstrateGoneError, ConfigError):
            await asyncio.shield(release_quietly(opened))
            raise
        except Exception as exc:
            if not last and not (isinstance(exc, ModelAPIError) and not exc.retryable):
                PARKED.park(inp.open.key, opened)
                raise
            failed = AgentResult(status="error", error=str(exc) or type(exc).__name__)
            return _handed_back(await merged_steps.close_after_agent(on, failed), opened)
        return _handed_back(result, opened)


def _closer(inp: AgentInput) -> Any:
    """``run_agent``'s ``after`` for a closing agent step: grade and tear down on its channel."""
    if not inp.close:
        return None

    async def close(result: AgentResult, client: Any) -> AgentResult:
        return await merged_steps.close_after_agent(inp, result, client)
    return close
