"""The recorded verify: open the verifier's session, grade in it, close it — three steps.

``verify_once.verify`` (one step: acquire, start, grade, release) cannot survive a crash between the
verifier's grade and the step's result without a host-local verdict cache. Here the verifier's
endpoint and started session are recorded in workflow history first (``open_verifier``); the grade
step then resumes that session by id, and grading is idempotent per session on the env server, so
a retried grade — on any worker — returns the verdict already reached instead of grading again;
``close_verifier`` ends the session and releases the verifier's own substrate afterwards.
Temporal-free; the Rollout workflow calls these behind ``workflow.patched("verify-session-recorded")``.
"""

from __future__ import annotations

import contextlib

from ..client.channel import (
    REFUSED_LIMIT,
    RESUME_TIMEOUT_S,
    end_session,
    fresh,
    grade_failure,
    ready_timeout,
    resume,
    session_of,
    start_task,
    to_grade,
)
from ..errors import ConfigError, ProtocolError
from ..models import Grade, Task
from ..runtimes import DurableProvider, provider_from_spec
from ..step_io import VerifierSession, VerifyInput
from .substrate import teardown_with

__all__ = ["close_verifier", "grade_verifier", "open_verifier", "shares_actor_server"]


def shares_actor_server(task: Task) -> bool:
    """The verifier runs as a new session on the actor's own server (same env, no config)."""
    verifier = task.verifier
    return verifier is not None and verifier.env == task.env and verifier.runtime_config is None


async def open_verifier(inp: VerifyInput, *, provider: DurableProvider | None = None,
                        start_key: str | None = None) -> VerifierSession:
    """Place the verifier (own substrate under ``f"{key}-verifier"``, or the actor's server),
    start its task in a new session and leave that session parked; returns where it is. Under
    ``start_key`` an open repeated after a lost result returns the session it started (its task
    set up once: ``protocol.FEATURE_START_KEY``)."""
    verifier = inp.task.verifier
    if verifier is None:
        raise ConfigError(f"task {inp.task.slug} has no verifier")
    if shares_actor_server(inp.task):
        # the actor's server is up: a refused port means it is gone
        endpoint, owned, timeout, refused_limit = inp.actor_endpoint, False, RESUME_TIMEOUT_S, REFUSED_LIMIT
    else:
        provider = provider or provider_from_spec(inp.provider)
        provider.check_config(verifier.runtime_config, what=f"verifier of {inp.task.slug}")
        endpoint = await provider.acquire(verifier, f"{inp.key}-verifier")  # idempotent by key
        owned, timeout, refused_limit = True, ready_timeout(endpoint), None
    client = await fresh(endpoint, timeout, refused_limit)
    try:
        await start_task(client, verifier, start_key)
        session = session_of(client)
    finally:
        with contextlib.suppress(Exception):
            await client.close()  # no bye: the session parks with its task started
    return VerifierSession(endpoint=endpoint, session=session, owned=owned)


async def grade_verifier(inp: VerifyInput) -> Grade:
    """Grade the recorded verifier session with the actor's result (idempotent on the server)."""
    assert inp.verifier_endpoint is not None and inp.verifier_session is not None
    verifier = inp.task.verifier
    name = verifier.id if verifier is not None else "?"
    client = await resume(inp.verifier_endpoint, inp.verifier_session)
    try:
        frame = await client.grade(inp.actor_raw)
    except ProtocolError as exc:
        return Grade.error(f"verifier {name!r}: {grade_failure(exc, None)}")
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return to_grade(frame)


async def close_verifier(opened: VerifierSession, *, provider: DurableProvider | None = None) -> None:
    """End the verifier's session; release its own substrate (never the actor's)."""
    if opened.owned:
        await teardown_with(opened.endpoint, opened.session,
                            provider or provider_from_spec(opened.endpoint.provider))
        return
    with contextlib.suppress(Exception):
        await end_session(opened.endpoint, opened.session)
