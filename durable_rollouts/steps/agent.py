"""The agent step: rebuild the agent, let it work on the rollout's session, store its trace.

``run_agent`` is what the ``agent`` activity calls; ``execute_agent`` runs an agent object on an
open channel (the direct executor calls it too). Agent failures and timeouts do not raise: they
are recorded in the trace and the result, so the rollout is still graded. Infrastructure
failures (substrate gone, a retryable model API error on the durable path, a checkpoint that
could not be made durable) do raise. Imports models, the channel helpers and the trace store;
the agent and its ``Run`` builder come from the caller (the sdk sits above the steps), and so
does the durable checkpointer (the activity's); never Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from ..client import channel, kept
from ..client.envclient import EnvClient
from ..models import Step, TaskCall, Trace, TraceRef
from ..step_io import AgentInput, AgentResult, Checkpoint
from ..stores.tracestore import TraceStore
from .agent_call import AgentLike, RunLike, call_agent

__all__ = ["Checkpointer", "RunFactory", "agent_channel", "astore_result", "execute_agent", "run_agent"]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 1.0

Checkpointer = Callable[[Checkpoint], Awaitable[None]]
# Builds the ``Run`` an agent receives (``sdk.run.Run.for_step``): the caller hands it in, so the
# steps never import the sdk that sits above them.
RunFactory = Callable[[AgentInput, EnvClient, Trace, "Checkpointer | None"], RunLike]


async def run_agent(inp: AgentInput, *, agent: AgentLike, new_run: RunFactory,
                    heartbeat: Callable[[], None] | None = None,
                    trace_store: TraceStore | None = None,
                    checkpointer: Checkpointer | None = None,
                    last_attempt: bool = False,
                    client: EnvClient | None = None,
                    after: Callable[[AgentResult, EnvClient], Awaitable[AgentResult]] | None = None,
                    ) -> AgentResult:
    """Let ``agent`` work on the session (from ``inp.checkpoint``), store its trace.

    On the ``last_attempt`` a model API error is retried in-process, then recorded (trace kept).
    ``agent``: ``inp.agent`` built by the caller; ``new_run`` builds its ``Run``. ``client``: the session's open
    connection, which this closes; None resumes the session on a new one. ``after``: more work on
    the same channel once the trace is stored (older releases' agent steps graded there).
    """
    async with agent_channel(inp, client) as open_channel:
        trace = await execute_agent(agent, inp, new_run=new_run, heartbeat=heartbeat,
                                    checkpointer=checkpointer,
                                    last_attempt=last_attempt, client=open_channel)
        result = await astore_result(trace, trace_store)
        if after is not None:
            result = await after(result, open_channel)
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
    """The agent's connection to its session (``client``, else the one the start step kept, else a
    new one); on exit kept open for the grade step where the endpoint allows it (``sdk.kept``),
    else closed without ``bye`` (the session parks for the grade step)."""
    if inp.endpoint is None or inp.session is None:
        raise ValueError("agent_channel needs an opened substrate (AgentInput.endpoint/session)")
    if client is None:
        client = await channel.resume(inp.endpoint, inp.session)
    async with kept.lent(inp.endpoint, client):  # kept for the grade step (unless closed already)
        yield client


async def execute_agent(agent: AgentLike, inp: AgentInput, *, new_run: RunFactory,
                        heartbeat: Callable[[], None] | None = None,
                        checkpointer: Checkpointer | None = None,
                        last_attempt: bool = False, client: EnvClient) -> Trace:
    """Run an agent object on the session under ``inp.timeout_s``; returns its trace.

    With ``inp.checkpoint`` the run resumes: the trace is the checkpointed one and the agent
    finds its state in ``run.restored_state``. ``checkpointer`` makes ``run.checkpoint`` durable.
    ``client``: the open ``agent_channel`` to run on (left open for the grade).
    """
    trace = Trace(trace_id=inp.rollout_id)
    run = new_run(inp, client, trace, checkpointer)
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
