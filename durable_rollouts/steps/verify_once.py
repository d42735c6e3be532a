"""The one-step verify of Rollouts started before the recorded verifier session.

``verify`` acquires the verifier, starts its task, grades it with the actor's result and releases
it, all in one activity; a verdict reached by a try whose worker then died is kept on this host
(``$ROLLOUTS_HOME/verdicts``, dropped at teardown by ``steps.substrate.forget_verdicts``) so a retry on the
same host never grades twice. New Rollouts record the verifier's session in history instead
(``steps.verifier``: no host-local state); this path stays for histories of release f54ad67 and for
nothing else. Imports the substrate steps' helpers, never Temporal.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ..client.channel import (
    REFUSED_LIMIT,
    RESUME_TIMEOUT_S,
    fresh,
    grade_failure,
    ready_timeout,
    start_task,
    to_grade,
)
from ..client.envclient import EnvClient
from ..errors import ConfigError, ProtocolError
from ..models import Grade, Task
from ..paths import atomic_write
from ..runtimes import DurableProvider, provider_from_spec
from ..step_io import VerifyInput
from .substrate import verdict_path

__all__ = ["verify"]


async def verify(inp: VerifyInput, *, provider: DurableProvider | None = None) -> Grade:
    """Grade ``inp.task.verifier`` with the actor's result; never re-runs the agent.

    Same env and no runtime_config: a new session on the actor's server. Otherwise the verifier
    is provisioned under ``f"{key}-verifier"`` and always released afterwards; its verdict is
    kept under ``$ROLLOUTS_HOME/verdicts`` until teardown so a retried step on the same host never
    grades twice. Only Rollouts started before the recorded verify (``sdk.verifier``: session
    recorded in history, no host-local state) still take this one-step path.
    """
    verifier = inp.task.verifier
    if verifier is None:
        raise ConfigError(f"task {inp.task.slug} has no verifier")
    if verifier.env == inp.task.env and verifier.runtime_config is None:
        client = await fresh(inp.actor_endpoint, RESUME_TIMEOUT_S, refused_limit=REFUSED_LIMIT)
        return await _grade_verifier(client, verifier, inp.actor_raw)
    provider = provider or provider_from_spec(inp.provider)
    provider.check_config(verifier.runtime_config, what=f"verifier of {inp.task.slug}")
    # A verdict reached by an earlier try of this step (its worker died before the result was
    # recorded) is kept on this host ($ROLLOUTS_HOME/verdicts, dropped at teardown): the verifier
    # grades once, like the actor's env does.
    verdict = verdict_path(inp.key)
    cached = _read_verdict(verdict)
    if cached is not None:
        grade, released = cached
        if not released:  # the crash came between the verdict and the release
            await provider.release(await provider.acquire(verifier, f"{inp.key}-verifier"))
            _write_verdict(verdict, grade, released=True)
        return grade
    endpoint = await provider.acquire(verifier, f"{inp.key}-verifier")
    try:
        client = await fresh(endpoint, ready_timeout(endpoint))
        grade = await _grade_verifier(client, verifier, inp.actor_raw)
        _write_verdict(verdict, grade, released=False)
    finally:
        await provider.release(endpoint)
    _write_verdict(verdict, grade, released=True)
    return grade


def _read_verdict(path: Path) -> tuple[Grade, bool] | None:
    try:
        data = json.loads(path.read_bytes())
        return Grade.model_validate(data["grade"]), bool(data.get("released"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_verdict(path: Path, grade: Grade, *, released: bool) -> None:
    with contextlib.suppress(OSError):  # best effort: without it a crash may re-grade
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"grade": grade.model_dump(mode="json"), "released": released}).encode())


async def _grade_verifier(client: EnvClient, verifier: Task, actor_raw: dict[str, Any]) -> Grade:
    try:
        await start_task(client, verifier)
        try:
            frame = await client.grade(actor_raw)
        except ProtocolError as exc:
            return Grade.error(f"verifier {verifier.id!r}: {grade_failure(exc, None)}")
        with contextlib.suppress(Exception):
            await client.bye()
        return to_grade(frame)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
