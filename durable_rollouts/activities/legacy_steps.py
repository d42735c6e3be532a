"""Merged steps over one control connection: open (provision -> connect -> start) and close
(grade -> teardown).

The direct executor runs a rollout with these (plain asyncio, one connection, no history to
show). Durable Rollouts run the card's steps one by one (``steps``); only histories of older
releases, whose Rollouts merged steps for speed, still schedule the ``rollouts.open`` and
``rollouts.grade_teardown`` activities and the agent step that opens or closes its own
substrate, which call these. Imports models, the channel helpers and ``steps``; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..client import channel
from ..client.envclient import EnvClient
from ..errors import StepFailed
from ..models import Grade, Task
from ..runtimes import DurableProvider, provider_from_spec
from ..step_io import AgentInput, AgentResult, GradeInput, Opened
from ..steps.substrate import release, teardown_with

__all__ = ["close_after_agent", "close_rollout", "open_channel", "open_rollout"]

log = logging.getLogger(__name__)


async def open_rollout(task: Task, key: str, provider: DurableProvider) -> Opened:
    """``provision -> connect -> start`` as one step, over one control connection.

    Idempotent per ``key`` like ``provision``. A failure after provisioning releases the
    substrate before it is raised (nobody else knows the endpoint yet); every failure is raised
    as :class:`StepFailed` naming the phase that failed.
    """
    opened, client = await open_channel(task, key, provider)
    await client.close()
    return opened


async def open_channel(task: Task, key: str, provider: DurableProvider) -> tuple[Opened, EnvClient]:
    """``open_rollout``, and its control connection left open for the caller, who closes it."""
    try:
        endpoint = await provider.acquire(task, key)
    except Exception as exc:
        raise StepFailed("provisioning", exc) from exc
    phase, session, client = "connecting", None, None
    try:
        client = await channel.fresh(endpoint, channel.ready_timeout(endpoint))
        session = channel.session_of(client)
        phase = "starting task"
        prompt = await channel.start_task(client, task)
    except BaseException as exc:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(teardown_with(endpoint, session, provider))
        if isinstance(exc, Exception):
            raise StepFailed(phase, exc) from exc
        raise
    return Opened(endpoint=endpoint, session=session, prompt=prompt,
                  ephemeral=bool(getattr(provider, "ephemeral", False))), client


async def close_rollout(inp: GradeInput, *, provider: DurableProvider | None = None,
                        client: EnvClient | None = None) -> Grade:
    """``grade -> teardown`` as one step, over one control connection (``client``: the agent's,
    still open, which this closes; None opens one).

    A failed grade is raised and nothing is torn down (the caller's teardown runs); once graded,
    teardown is best effort and never loses the grade.
    """
    if client is None:
        client = await channel.resume(inp.endpoint, inp.session)
    try:
        result = await channel.grade_in(client, inp.answer, inp.agent_error)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.end_in(client), 5.0)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    try:
        await release(inp.endpoint, provider or provider_from_spec(inp.endpoint.provider))
    except Exception as exc:  # noqa: BLE001 - the grade is what matters now
        log.warning("teardown of %s failed after grading: %s", inp.endpoint.key, exc)
    return result


async def close_after_agent(inp: AgentInput, result: AgentResult,
                            client: EnvClient | None = None) -> AgentResult:
    """``close_rollout`` right after the agent, on its channel ``client`` (None opens one).

    Returns ``result`` with its ``grade`` once graded (the substrate is then released). A grade
    that cannot be had here (the channel failed) is logged and left out, and nothing is torn
    down: the workflow's own close step then grades with its retries.
    """
    assert inp.endpoint is not None and inp.session is not None  # it ran on them
    grade_input = GradeInput(endpoint=inp.endpoint, session=inp.session, answer=result.content,
                             agent_error=result.error)
    try:
        grade = await close_rollout(grade_input, client=client)
    except Exception as exc:  # noqa: BLE001 - left to the close step, which reports it
        log.warning("grading %s in the agent step failed, the close step grades it: %s",
                    inp.rollout_id, exc)
        return result
    return result.model_copy(update={"grade": grade})
