"""The rollout steps, as plain async functions with one pydantic input each.

``provision -> connect -> start -> run_agent -> grade -> [verify] -> teardown``. Every step after
``connect`` reconnects with ``hello{session_id}``, so each may run in a fresh process (Temporal
activities call them; the direct executor calls them in one process). Errors are classified
here, at the edge: ``ConfigError`` for user mistakes (never retried), ``SubstrateGoneError`` when
the endpoint refuses connections or forgot the session (reprovision), anything else is
retryable infrastructure. The verify step lives beside them: ``sdk.verifier`` (the recorded
verifier session) and ``sdk.verify_once`` (the one-step verify of older rollouts). Imports
models, errors, protocol codes, the client, agents, providers and the trace store; never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

from ..errors import (
    ConfigError,
    ProtocolError,
    ReadyTimeoutError,
    RemoteTaskError,
    StepFailed,
    SubstrateGoneError,
    UnauthorizedError,
)
from ..models import (
    AgentInput,
    AgentResult,
    Checkpoint,
    ConnectInput,
    Endpoint,
    Grade,
    GradeInput,
    Opened,
    ProvisionInput,
    Session,
    StartInput,
    Step,
    Task,
    TaskCall,
    TeardownInput,
    Trace,
    TraceRef,
)
from ..protocol import ErrorCode
from .agent_call import call_agent
from .agents import Agent, load_agent
from .client import EnvClient
from .client import connect as _open
from .paths import rollouts_home, safe_name
from .providers import DurableProvider, provider_from_spec
from .run import Run
from .tokens import endpoint_token, token_rejected, uses_derived_token
from .tracestore import TraceStore

__all__ = [
    "actor_result",
    "agent_channel",
    "close_after_agent",
    "connect",
    "execute_agent",
    "close_rollout",
    "grade",
    "open_rollout",
    "provision",
    "run_agent",
    "start",
    "astore_result",
    "teardown",
    "teardown_with",
]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 1.0
DEFAULT_READY_TIMEOUT_S = 60.0
RESUME_TIMEOUT_S = 30.0
_RESUME_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # a just-closed session may not be parked yet
_REFUSED_LIMIT = 3  # refusals in a row (0.1 s, 0.2 s apart) before a resumed substrate counts as gone


# ---------------------------------------------------------------------------------------------
# Connection helpers


def _ready_timeout(endpoint: Endpoint, override: float | None = None) -> float:
    if override:
        return override
    if endpoint.params.get("ready_timeout"):
        return float(endpoint.params["ready_timeout"])
    limits = endpoint.config.limits if endpoint.config is not None else None
    if limits is not None and limits.startup_timeout_s:
        return limits.startup_timeout_s
    return DEFAULT_READY_TIMEOUT_S


async def _hello(endpoint: Endpoint, ready_timeout: float, session_id: str | None = None,
                 refused_limit: int | None = None) -> EnvClient:
    """Connect with the endpoint's token (derived again from its key: never stored in history).

    ``refused_limit``: for a server that was already up, a port refused that many times in a row
    (about 0.3 s for 3) is a gone substrate, while a slow one (a busy env loop) still gets the whole
    ``ready_timeout``; None retries refusals too (a just-provisioned server may not listen yet).
    """
    try:
        return await _open(endpoint.url, ready_timeout=ready_timeout, session_id=session_id,
                           token=endpoint_token(endpoint), refused_limit=refused_limit)
    except (ConnectionRefusedError, ConnectionResetError) as exc:  # only with a refused_limit
        raise SubstrateGoneError(f"substrate at {endpoint.url} refuses connections: {exc}") from exc
    except UnauthorizedError as exc:
        if not uses_derived_token(endpoint):
            raise
        raise token_rejected(exc, endpoint.url) from exc


async def _fresh(endpoint: Endpoint, ready_timeout: float, refused_limit: int | None = None) -> EnvClient:
    """A new session; a substrate that never answers (or refuses, see ``_hello``) is gone."""
    try:
        return await _hello(endpoint, ready_timeout, refused_limit=refused_limit)
    except ReadyTimeoutError as exc:
        raise SubstrateGoneError(f"substrate at {endpoint.url} did not answer: {exc}") from exc


async def _resume(endpoint: Endpoint, session: Session, ready_timeout: float | None = None) -> EnvClient:
    """Reconnect to ``session``; refused or unknown session -> SubstrateGoneError.

    A refused port is reported gone after ``_REFUSED_LIMIT`` refusals (``_hello``), while a slow
    substrate (a busy env loop) gets the whole resume timeout.
    """
    timeout = ready_timeout or float(endpoint.params.get("resume_timeout", RESUME_TIMEOUT_S))
    last: ProtocolError | None = None
    for delay in (*_RESUME_BACKOFF_S, None):
        try:
            return await _hello(endpoint, timeout, session.session_id, refused_limit=_REFUSED_LIMIT)
        except ReadyTimeoutError as exc:
            raise SubstrateGoneError(f"substrate at {endpoint.url} is gone: {exc}") from exc
        except ProtocolError as exc:
            if exc.code != ErrorCode.INVALID_REQUEST:
                raise
            last = exc
        if delay is not None:
            await asyncio.sleep(delay)
    raise SubstrateGoneError(
        f"session {session.session_id} is unknown at {endpoint.url} (the environment restarted or "
        f"the session expired): {last.message if last else ''}"
    )


def _raise_start_error(exc: ProtocolError, task: Task) -> NoReturn:
    """Re-raise a refused ``tasks.start``: bad arguments are a ConfigError (final), the rest as is."""
    if exc.code == ErrorCode.INVALID_PARAMS:
        raise ConfigError(f"task {task.id!r} of env {task.env!r} was rejected: {exc.message}") from exc
    raise exc


# ---------------------------------------------------------------------------------------------
# Steps


async def provision(inp: ProvisionInput) -> Endpoint:
    """Place the task's environment with the provider; idempotent per ``inp.key``."""
    return await provider_from_spec(inp.provider).acquire(inp.task, inp.key)


async def connect(inp: ConnectInput) -> Session:
    """Open a control-channel session on the endpoint and leave it parked for later steps."""
    client = await _fresh(inp.endpoint, _ready_timeout(inp.endpoint, inp.ready_timeout_s))
    try:
        return _session_of(client)
    finally:
        await client.close()


async def start(inp: StartInput) -> dict[str, Any]:
    """Start ``inp.task`` in the session; returns the prompt frame."""
    client = await _resume(inp.endpoint, inp.session)
    try:
        return await _start_task(client, inp.task)
    finally:
        await client.close()


async def _start_task(client: EnvClient, task: Task) -> dict[str, Any]:
    try:
        return await client.start_task(task.id, dict(task.args))
    except ProtocolError as exc:
        _raise_start_error(exc, task)


def _session_of(client: EnvClient) -> Session:
    return Session(session_id=client.session_id, env_name=client.env.name,
                   env_version=client.env.version, bindings=list(client.bindings))


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
    """``open_rollout``, and its control connection left open for the caller (``run_agent``'s
    ``client``), who closes it."""
    try:
        endpoint = await provider.acquire(task, key)
    except Exception as exc:
        raise StepFailed("provisioning", exc) from exc
    phase, session, client = "connecting", None, None
    try:
        client = await _fresh(endpoint, _ready_timeout(endpoint))
        session = _session_of(client)
        phase = "starting task"
        prompt = await _start_task(client, task)
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


Checkpointer = Callable[[Checkpoint], Awaitable[None]]


async def run_agent(inp: AgentInput, *, heartbeat: Callable[[], None] | None = None,
                    trace_store: TraceStore | None = None,
                    checkpointer: Checkpointer | None = None,
                    last_attempt: bool = False, agent: Agent | None = None,
                    client: EnvClient | None = None) -> AgentResult:
    """Rebuild the agent, let it work on the session (from ``inp.checkpoint``), store its trace.

    With ``inp.close`` it then grades and tears down over the agent's own channel
    (``close_after_agent``). Agent failures and timeouts do not raise: they are recorded in the
    trace and the result (so the rollout is still graded). Infrastructure failures (substrate
    gone, a retryable model API error on the durable path, a checkpoint that could not be made
    durable) do raise; on the ``last_attempt`` a model API error is retried in-process, then
    recorded (trace kept). ``agent``: ``inp.agent`` already built (else it is built here).
    ``client``: the session's open connection (``open_channel``), which this closes; None
    resumes the session on a new one.
    """
    agent = agent or load_agent(inp.agent)
    async with agent_channel(inp, client) as channel:
        trace = await execute_agent(agent, inp, heartbeat=heartbeat, checkpointer=checkpointer,
                                    last_attempt=last_attempt, client=channel)
        result = await astore_result(trace, trace_store)
        if inp.close:
            result = await close_after_agent(inp, result, channel)
    return result


async def astore_result(trace: Trace, trace_store: TraceStore | None = None) -> AgentResult:
    """Put ``trace`` in the store (without blocking the event loop: the store's I/O runs on its
    own loop) and summarise it as an AgentResult."""
    return _agent_result(trace, await (trace_store or TraceStore()).aput(trace))


def _agent_result(trace: Trace, ref: TraceRef) -> AgentResult:
    error = next((s.error for s in reversed(trace.steps) if s.error), None) if trace.is_error else None
    return AgentResult(content=trace.content, status=trace.status, stop_reason=trace.stop_reason,
                       error=error, trace_ref=ref)


@contextlib.asynccontextmanager
async def agent_channel(inp: AgentInput, client: EnvClient | None = None) -> AsyncIterator[EnvClient]:
    """The agent's connection to its parked session (``client``, else a new one), closed without
    ``bye`` on exit (the session stays parked for a grade step, unless the caller ended it)."""
    if inp.endpoint is None or inp.session is None:
        raise ValueError("agent_channel needs an opened substrate (AgentInput.on)")
    if client is None:
        client = await _resume(inp.endpoint, inp.session)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def execute_agent(agent: Agent, inp: AgentInput, *,
                        heartbeat: Callable[[], None] | None = None,
                        checkpointer: Checkpointer | None = None,
                        last_attempt: bool = False, client: EnvClient) -> Trace:
    """Run an agent object on the session under ``inp.timeout_s``; returns its trace.

    With ``inp.checkpoint`` the run resumes: the trace is the checkpointed one and the agent
    finds its state in ``run.restored_state``. ``checkpointer`` makes ``run.checkpoint`` durable.
    ``client``: the open ``agent_channel`` to run on (left open for the grade).
    """
    trace = Trace(trace_id=inp.rollout_id)
    run = Run(task=inp.task, prompt=inp.prompt, bindings=list(client.bindings), client=client,
              trace=trace, job_id=inp.job_id, group_id=inp.group_id, rollout_id=inp.rollout_id,
              _checkpointer=checkpointer)
    if inp.checkpoint is not None:
        run.restore(inp.checkpoint)
        trace.extra["resumed_at_step"] = len(trace.steps)
    else:
        trace.record(Step(source="user", messages=[{"role": "user", "content": inp.prompt.get("prompt", inp.prompt)}],
                          task_call=TaskCall(phase="setup", name=inp.task.id, arguments=inp.task.args,
                                             result=inp.prompt), ended_at=time.time()))
    beat = asyncio.create_task(_beat(heartbeat)) if heartbeat is not None else None
    timeout = inp.timeout_s if inp.timeout_s is not None else agent.timeout_s
    try:
        async with asyncio.timeout(timeout) as scope:
            await call_agent(agent, run, durable=checkpointer is not None and not last_attempt)
    except TimeoutError:
        if not scope.expired():
            raise
        trace.status = "error"
        trace.stop_reason = "timeout"
        trace.record(Step(source="system", error=f"agent timed out after {timeout}s", ended_at=time.time()))
    finally:
        if beat is not None:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        with contextlib.suppress(Exception):
            await run.close_capabilities()
        run.client = None
    if trace.status == "running":
        trace.status = "completed"
        trace.stop_reason = trace.stop_reason or "done"
    return trace


async def _beat(heartbeat: Callable[[], None]) -> None:
    while True:
        try:
            heartbeat()
        except Exception:  # a heartbeat problem must not kill the agent
            log.debug("heartbeat failed", exc_info=True)
        await asyncio.sleep(HEARTBEAT_EVERY_S)


async def grade(inp: GradeInput, *, client: EnvClient | None = None) -> Grade:
    """Grade the session's task with the agent's answer (idempotent on the server).

    ``client``: the agent's channel, still open (left open); None opens and closes one.
    """
    if client is not None:
        return await _grade_in(client, inp)
    client = await _resume(inp.endpoint, inp.session)
    try:
        return await _grade_in(client, inp)
    finally:
        await client.close()


async def _grade_in(client: EnvClient, inp: GradeInput) -> Grade:
    try:
        frame = await client.grade(inp.answer)
    except ProtocolError as exc:  # the env refused or the task raised: a result, not a retry
        return Grade.error(_grade_failure(exc, inp.agent_error),
                           raw=_failed_raw(inp.answer, inp.agent_error or exc.message))
    return _to_grade(frame)


async def close_rollout(inp: GradeInput, *, provider: DurableProvider | None = None,
                        client: EnvClient | None = None) -> Grade:
    """``grade -> teardown`` as one step, over one control connection (``client``: the agent's,
    still open, which this closes; None opens one).

    Only for a substrate that dies with this process (``Opened.ephemeral``): a retry after a crash
    finds it gone either way. A failed grade is raised and nothing is torn down (the caller's
    teardown runs); once graded, teardown is best effort and never loses the grade.
    """
    if client is None:
        client = await _resume(inp.endpoint, inp.session)
    try:
        result = await _grade_in(client, inp)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_end_in(client), 5.0)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    try:
        await _release(inp.endpoint, provider or provider_from_spec(inp.endpoint.provider))
    except Exception as exc:  # noqa: BLE001 - the grade is what matters now
        log.warning("teardown of %s failed after grading: %s", inp.endpoint.key, exc)
    return result


async def close_after_agent(inp: AgentInput, result: AgentResult,
                            client: EnvClient | None = None) -> AgentResult:
    """``close_rollout`` right after the agent, on its channel ``client`` (``AgentInput.close``;
    None opens one).

    Returns ``result`` with its ``grade`` once graded (the substrate is then released). A grade
    that cannot be had here (the channel failed) is logged and left out, and nothing is torn
    down: the workflow's own close step then grades with its retries, as without this.
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


def _grade_failure(exc: ProtocolError, agent_error: str | None) -> str:
    what = "grading raised in the environment" if isinstance(exc, RemoteTaskError) else "grading was refused"
    suffix = f" (agent error: {agent_error})" if agent_error else ""
    return f"{what}: {exc.message}{suffix}"


def _failed_raw(answer: str | None, content: str | None) -> dict[str, Any]:
    return {"score": 0.0, "answer": answer, "content": content, "isError": True}


def _to_grade(frame: Any) -> Grade:
    if not isinstance(frame, dict):
        return Grade.error(f"grade frame is not an object: {frame!r}")
    try:
        return Grade.from_frame(frame)
    except ValueError as exc:
        return Grade.error(str(exc), raw=frame)


def actor_result(grade: Grade | None, answer: str | None, agent_error: str | None = None) -> dict[str, Any]:
    """What a verifier receives as its answer: the actor's grade frame, or — when the agent
    failed or the actor could not be graded — ``{score: 0, answer, content, isError: True}``."""
    if agent_error is None and grade is not None and not grade.is_error and grade.raw:
        return dict(grade.raw)
    content = agent_error or (grade.content if grade is not None else None)
    return _failed_raw(answer, content)


def _verdict_path(key: str) -> Path:
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
    """Best effort: cancel and end the session, then release the substrate (idempotent)."""
    await teardown_with(inp.endpoint, inp.session, provider or provider_from_spec(inp.endpoint.provider))


async def teardown_with(endpoint: Endpoint, session: Session | None, provider: DurableProvider) -> None:
    """``teardown`` with a provider object (the direct executor has one at hand)."""
    if session is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_end_session(endpoint, session), 5.0)
    await _release(endpoint, provider)


async def _release(endpoint: Endpoint, provider: DurableProvider) -> None:
    """Release the substrate (idempotent) and forget its cached verifier verdicts."""
    await provider.release(endpoint)
    forget_verdicts(endpoint.key)


async def _end_session(endpoint: Endpoint, session: Session) -> None:
    client = await _resume(endpoint, session, ready_timeout=1.0)
    try:
        await _end_in(client)
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _end_in(client: EnvClient) -> None:
    """End the session: ``bye`` also tears its task down (no ``tasks.cancel`` round trip first)."""
    with contextlib.suppress(ProtocolError):
        await client.bye()
