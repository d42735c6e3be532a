"""Per-process liveness: one ``WorkerWatch`` per worker process, instead of a fast heartbeat per agent.

A waiting agent used to cost the server one heartbeat write every 16 s, so a dead worker's agent
steps were retried within 20 s: at 2,000 waiting agents that was most of what the orchestrator
spent while nothing happened. Now each worker process runs one sentinel activity
(``ACT_WORKER_ALIVE``) on a queue only it polls, beating every few seconds with the agent steps it
runs as details (:func:`encode_running`). This workflow schedules the sentinel in rounds. When a
round stops beating for ``timeout_s`` (the process died or hung), the workflow, on any live
worker, keeps those of the last beat's agent steps still pending on that worker (``ACT_AGENTS_ON``:
one its retry policy already moved elsewhere is left alone) and signals their Rollouts
(``SIG_AGENT_WORKER_LOST`` with the agent schedule that ran there); each cancels that agent step and schedules it again (or reprovisions,
when its substrate lived on that worker). The agent step keeps a long heartbeat timeout as a
backstop (``settings.AGENT_HEARTBEAT_WATCHED_S``).

Deterministic: stdlib, temporalio and the pure models only.
"""

from __future__ import annotations

import asyncio
import base64
import json
import zlib
from datetime import timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, TimeoutError, TimeoutType

from durable_rollouts.models import StrictModel
from durable_rollouts.workflows.types import ACT_AGENTS_ON, ACT_WORKER_ALIVE, SIG_AGENT_WORKER_LOST

__all__ = ["AgentLost", "AgentsOn", "BEATS_PER_TIMEOUT", "WatchBeat", "SIGNALS_PER_TASK", "WatchInput", "WatchResult", "WatchRound",
           "WorkerWatch", "decode_running", "encode_running"]

BEATS_PER_TIMEOUT = 4  # the sentinel beats (and its worker's throttle lets through) 4 per timeout
SIGNALS_PER_TASK = 100  # lost agents signalled per workflow task (Temporal bounds pending signals)
ROUNDS_PER_RUN = 200  # continue-as-new after this many rounds: the history stays small


class WatchInput(StrictModel):
    """One worker process's watch: its sentinel queue, its identity, how long a missed beat is."""

    queue: str
    identity: str = ""
    timeout_s: float = Field(default=10.0, gt=0)
    round_s: float = Field(default=3600.0, gt=0)  # a sentinel returns after this long
    last: str = ""  # the previous round's running agents (encoded): a round never picked up


class WatchRound(StrictModel):
    """One sentinel round: beat every ``timeout_s / 4`` for ``round_s``."""

    timeout_s: float
    round_s: float


class AgentsOn(StrictModel):
    """A dead worker and the agent steps its last beat listed (encoded)."""

    identity: str
    running: str


class WatchBeat(StrictModel):
    """What a sentinel round returns: the running agents, and whether its process shuts down."""

    running: str = ""
    stopped: bool = False


class WatchResult(StrictModel):
    lost: int = 0  # agent steps signalled lost (0: the watch ended with its worker's shutdown)
    why: str = ""


class AgentLost(StrictModel):
    """To a Rollout: the agent schedule ``schedule`` ran on ``worker``, which died."""

    schedule: int
    worker: str = ""


def encode_running(running: list[tuple[str, int]]) -> str:
    """The sentinel's heartbeat details: (rollout workflow id, agent schedule) pairs, compressed
    (ids share their job prefix; 5,000 of them fit a small heartbeat)."""
    raw = json.dumps(sorted(running), separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw)).decode()


def decode_running(details: str) -> list[tuple[str, int]]:
    if not details:
        return []
    return [(str(w), int(s)) for w, s in json.loads(zlib.decompress(base64.b64decode(details)))]


@workflow.defn(name="WorkerWatch")
class WorkerWatch:
    """Schedules a worker process's sentinel round after round; tells its agents' Rollouts when
    it stops beating."""

    @workflow.run
    async def run(self, inp: WatchInput) -> WatchResult:
        last = inp.last
        for _ in range(ROUNDS_PER_RUN):
            try:
                beat = await workflow.execute_activity(
                    ACT_WORKER_ALIVE, WatchRound(timeout_s=inp.timeout_s, round_s=inp.round_s),
                    result_type=WatchBeat, task_queue=inp.queue, summary="worker alive",
                    schedule_to_start_timeout=timedelta(seconds=inp.timeout_s),
                    start_to_close_timeout=timedelta(seconds=inp.round_s + 4 * inp.timeout_s),
                    heartbeat_timeout=timedelta(seconds=inp.timeout_s),
                    retry_policy=RetryPolicy(maximum_attempts=1))
                if beat.stopped:
                    return WatchResult(why="the worker shut down")
                last = beat.running
            except ActivityError as err:
                cause = err.cause
                if isinstance(cause, CancelledError):
                    return WatchResult(why="the worker shut down")
                if isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT:
                    details = cause.last_heartbeat_details
                    last = str(details[0]) if details else ""
                why = f"the sentinel failed: {cause or err}"
                if last and decode_running(last):  # only those its worker still holds
                    # local: a hung worker's open polls cannot swallow it
                    last = await workflow.execute_local_activity(
                        ACT_AGENTS_ON, AgentsOn(identity=inp.identity, running=last),
                        result_type=str, summary="agent steps still on the dead worker",
                        start_to_close_timeout=timedelta(minutes=5))
                return WatchResult(lost=await self._tell(decode_running(last), inp.identity), why=why)
        workflow.continue_as_new(inp.model_copy(update={"last": last}))

    async def _tell(self, lost: list[tuple[str, int]], worker: str) -> int:
        """Signal each Rollout whose agent step ran on the dead worker (a finished one: ignored)."""
        for i in range(0, len(lost), SIGNALS_PER_TASK):
            await asyncio.gather(*(
                workflow.get_external_workflow_handle(wid).signal(
                    SIG_AGENT_WORKER_LOST, AgentLost(schedule=schedule, worker=worker))
                for wid, schedule in lost[i:i + SIGNALS_PER_TASK]), return_exceptions=True)
        if lost:
            workflow.logger.warning("worker %s stopped beating: %d agent steps told to run again",
                                    worker, len(lost))
        return len(lost)
