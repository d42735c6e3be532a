"""The rollout steps, as plain async functions with one pydantic input each.

``provision -> connect -> start -> agent -> grade -> [verify] -> teardown``: the ``Rollout``
workflow runs each as its own activity and ``run_direct`` calls them in plain asyncio (both walk
``steps.plan``); the agent step lives in ``steps.agent``, the verifier's in ``steps.verifier``. Every step after ``connect`` resumes the session by id (``channel``), so
each may run in a fresh process. Errors are classified at the edge (``channel``): ConfigError
for user mistakes, SubstrateGoneError for a gone substrate, anything else is retryable
infrastructure. Imports models, errors, the channel helpers and providers; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from ..client import channel, kept
from ..errors import SessionGoneError, SubstrateGoneError
from ..models import Endpoint, Grade, Session
from ..paths import rollouts_home, safe_name
from ..runtimes import DurableProvider, provider_from_spec
from ..step_io import (
    ConnectInput,
    GradeInput,
    ProvisionInput,
    Started,
    StartInput,
    TeardownInput,
)
from ..stores import grade_receipts

__all__ = [
    "actor_result",
    "connect",
    "forget_verdicts",
    "grade",
    "provision",
    "release",
    "start",
    "teardown",
    "teardown_with",
]


async def provision(inp: ProvisionInput, *, provider: DurableProvider | None = None) -> Endpoint:
    """Place the task's environment with the provider (``provider``, else rebuilt from
    ``inp.provider``); idempotent per ``inp.key``."""
    return await (provider or provider_from_spec(inp.provider)).acquire(inp.task, inp.key)


async def connect(inp: ConnectInput) -> Session:
    """Open a control-channel session on the endpoint and leave it parked for later steps."""
    client = await channel.fresh(inp.endpoint, channel.ready_timeout(inp.endpoint, inp.ready_timeout_s))
    await kept.keep_or_close(inp.endpoint, client)  # the start step may take it back (``kept``)
    return channel.session_of(client)


async def start(inp: StartInput, *, start_key: str | None = None) -> dict[str, Any] | Started:
    """Start ``inp.task`` in the session; returns the prompt frame (``Started`` with ``with_session``).

    With ``with_session`` on a HUD v6 server the task starts in a new session (the connect step's
    ended with its connection); ``Started.session`` names it for the later steps. ``start_key``
    (the durable step's: one per rollout attempt of one workflow run) makes a replayed start
    return the task already started under it, in that task's session, where the server takes
    keys (``protocol.FEATURE_START_KEY``): the task's setup runs once.
    """
    client = await channel.start_client(inp.endpoint, inp.session, may_move=inp.with_session)
    async with kept.lent(inp.endpoint, client):  # kept for the agent step
        prompt = await channel.start_task(client, inp.task, start_key)
    return Started(session=channel.session_of(client), prompt=prompt) if inp.with_session else prompt


async def grade(inp: GradeInput, *, client: channel.EnvClient | None = None, retried: bool = False) -> Grade:
    """Grade the session's task with the agent's answer (idempotent on our server).

    ``client``: the agent's channel, still open (left open); None opens and closes one.
    ``retried``: an earlier try of this step may have graded already. Our server then answers with
    the same grade; a HUD v6 server has forgotten the graded session, and the grade is reported
    lost (``channel.lost_grade``) instead of reprovisioning and re-running the agent.
    Every grade received is kept as a receipt on this host (``stores.grade_receipts``); a grade
    that finds its substrate gone returns the receipt if there is one (graded before, then torn
    down or lost before the grade was recorded), so the rollout does not run again.
    """
    if client is not None:
        return await channel.grade_in(client, inp.answer, inp.agent_error)
    key, session_id = inp.endpoint.key, inp.session.session_id
    try:
        client = await channel.resume(inp.endpoint, inp.session)
    except SubstrateGoneError as exc:
        # graded here before, then torn down (or lost with its worker) before the grade was
        # recorded: the receipt has what the environment said (``stores.grade_receipts``)
        if (kept_grade := grade_receipts.find(key, session_id)) is not None:
            return kept_grade
        if (isinstance(exc, SessionGoneError) and retried
                and not channel.SERVER_TRAITS[inp.session.server].keeps_graded_sessions):
            return channel.lost_grade(inp.session, inp.answer, inp.agent_error, exc)
        raise
    async with kept.lent(inp.endpoint, client):  # kept for the teardown step's bye
        graded = await channel.grade_in(client, inp.answer, inp.agent_error)
    grade_receipts.keep(key, session_id, graded)  # best effort: a failed write only logs
    return graded


def actor_result(grade: Grade | None, answer: str | None, agent_error: str | None = None) -> dict[str, Any]:
    """What a verifier receives as its answer: the actor's grade frame, or — when the agent
    failed or the actor could not be graded — ``{score: 0, answer, content, isError: True}``."""
    if agent_error is None and grade is not None and not grade.is_error and grade.raw:
        return dict(grade.raw)
    content = agent_error or (grade.content if grade is not None else None)
    return channel.failed_raw(answer, content)


def verdict_path(key: str) -> Path:
    """Where the one-step verify keeps a verdict on this host (``verify_once``)."""
    return rollouts_home() / "verdicts" / f"{safe_name(key)}.json"


def forget_verdicts(key: str) -> None:
    """Drop the cached verifier verdicts of the rollout attempt placed under ``key``."""
    folder = rollouts_home() / "verdicts"
    if not folder.is_dir():  # no verifier ever ran here: skip the glob (every teardown calls this)
        return
    name = safe_name(key)
    for path in (folder / f"{name}.json", *folder.glob(f"{name}-v*.json")):
        with contextlib.suppress(OSError):
            path.unlink()


async def teardown(inp: TeardownInput, *, provider: DurableProvider | None = None) -> None:
    """Best effort: end the session, then release the substrate (idempotent)."""
    await teardown_with(inp.endpoint, inp.session, provider or provider_from_spec(inp.endpoint.provider))


async def teardown_with(endpoint: Endpoint, session: Session | None, provider: DurableProvider) -> None:
    """``teardown`` with a provider object (the direct executor has one at hand)."""
    if session is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.end_session(endpoint, session), 5.0)
    await release(endpoint, provider)


async def release(endpoint: Endpoint, provider: DurableProvider) -> None:
    """Release the substrate (idempotent) and forget its cached verifier verdicts."""
    await provider.release(endpoint)
    forget_verdicts(endpoint.key)
