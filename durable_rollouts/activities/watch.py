"""The worker process's side of the watch (``workflows.worker_watch``): which agent steps it runs,
and the sentinel that beats with them.

``RunningAgents`` is kept by the agent activity: an agent step enters before its agent runs and
leaves when it ends. Entering waits until the sentinel's heartbeat that lists it is recorded by
the server, so no agent step runs that the watch would not report if this process died the next
moment. The sentinel sends its heartbeats itself (``RecordActivityTaskHeartbeat``, awaited)
rather than through temporalio's throttled ``activity.heartbeat``, whose sends cannot be awaited:
one heartbeat carries every entry made while the previous one was in flight, and with nothing
entering it beats every ``timeout / 4``. temporalio's own beat (the sentinel must send it, or
its attempt is cancelled) records its details too, so it is handed every list ``send`` records:
whichever beat lands last names every agent step. Only a temporalio beat already in flight when
an agent step enters can land after that entry's beat; the next one, within ``timeout / 4``,
lists it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

from temporalio import activity
from temporalio.api.common.v1 import Payloads
from temporalio.api.workflowservice.v1 import RecordActivityTaskHeartbeatRequest

from durable_rollouts.workflows.types import ACT_AGENT, ACT_AGENTS_ON, ACT_WORKER_ALIVE
from durable_rollouts.workflows.worker_watch import (
    BEATS_PER_TIMEOUT,
    AgentsOn,
    WatchBeat,
    WatchRound,
    decode_running,
    encode_running,
)

__all__ = ["RunningAgents", "WatchActivities"]

log = logging.getLogger(__name__)

DESCRIBES_AT_ONCE = 32  # rollouts described at once by ``agents_on``
ENTER_WAIT_S = 5.0  # an agent step waits at most this long for the beat that lists it


class RunningAgents:
    """The agent steps running in this process: (rollout workflow id, agent schedule)."""

    def __init__(self) -> None:
        self._running: Counter[tuple[str, int]] = Counter()
        self._changes = 0  # bumped by every entry
        self._sent = 0  # the changes the last recorded beat included
        self._lock = asyncio.Lock()
        self._send: Callable[[str], Awaitable[None]] | None = None  # the live sentinel's

    @contextlib.asynccontextmanager
    async def running(self, workflow_id: str, schedule: int) -> AsyncIterator[None]:
        key = (workflow_id, schedule)
        self._running[key] += 1
        self._changes += 1
        try:
            await self.flush()
            yield
        finally:
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]

    def encoded(self) -> str:
        return encode_running(list(self._running))

    async def flush(self, *, force: bool = False) -> bool:
        """Have the sentinel record a beat with every entry so far; False if one did not land
        (no sentinel: nothing to do, True).

        Callers that queue behind a beat in flight are served by the next one, together."""
        wanted = self._changes
        async with self._lock:
            send = self._send
            if send is None or (self._sent >= wanted and not force):
                return True
            changes = self._changes
            try:
                await asyncio.wait_for(send(self.encoded()), ENTER_WAIT_S)
            except Exception as exc:  # the agent step's own heartbeat timeout is the backstop
                log.warning("worker watch: a beat was not recorded: %s", exc)
                return False
            self._sent = changes
            return True

    def attach(self, send: Callable[[str], Awaitable[None]] | None) -> None:
        self._send = send

    def __len__(self) -> int:
        return len(self._running)


class WatchActivities:
    """The sentinel of one worker process, and the check the watch makes when one dies."""

    def __init__(self, running: RunningAgents) -> None:
        self.running = running
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """This process shuts down: the sentinel returns ``stopped`` (its watch ends quietly)."""
        self._stopping.set()

    @activity.defn(name=ACT_WORKER_ALIVE)
    async def worker_alive(self, round_: WatchRound) -> WatchBeat:
        """Beat with the running agents (at once on every entry, else every ``timeout_s / 4``)
        for ``round_s``; returns them. Ends early, ``stopped``, when this process shuts down or
        the watch is cancelled."""
        info = activity.info()
        client = activity.client()
        sentinel = contextvars.copy_context()  # temporalio's beat of this activity, from anywhere

        async def send(details: str) -> None:
            payloads = await client.data_converter.encode([details])
            reply = await client.workflow_service.record_activity_task_heartbeat(
                RecordActivityTaskHeartbeatRequest(
                    task_token=info.task_token, details=Payloads(payloads=payloads),
                    identity=client.identity, namespace=client.namespace))
            # temporalio's throttled beat (it cancels an attempt that sends none) records its
            # details over ours when it lands: give it the same, or a beat without the agent
            # steps would be the last the server has when this process dies (the watch then
            # finds none of them, and each waits out its own heartbeat timeout)
            sentinel.run(activity.heartbeat, details)
            if reply.cancel_requested:
                self._stopping.set()

        loop = asyncio.get_running_loop()
        end = loop.time() + round_.round_s
        every = round_.timeout_s / BEATS_PER_TIMEOUT
        self.running.attach(send)
        landed = loop.time()
        try:
            while loop.time() < end and not self._stopping.is_set():
                if await self.running.flush(force=True):
                    landed = loop.time()  # ``send`` gave temporalio's beat the same list
                elif loop.time() - landed > round_.timeout_s:
                    break  # the watch has taken this process for dead: its runner starts anew
                else:
                    # no send landed: temporalio's beat still goes (or its attempt is cancelled)
                    activity.heartbeat(self.running.encoded())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(),
                                           min(every, max(0.0, end - loop.time())))
        finally:
            self.running.attach(None)
        return WatchBeat(running=self.running.encoded(), stopped=self._stopping.is_set())

    @activity.defn(name=ACT_AGENTS_ON)
    async def agents_on(self, dead: AgentsOn) -> str:
        """Of the (rollout, agent schedule) pairs a dead worker's last beat listed, those whose
        agent step is still pending with that worker as its last: an agent step its retry
        policy already moved to a live worker is left alone. Encoded as the beat was."""
        client = activity.client()
        listed = decode_running(dead.running)

        async def still_there(workflow_id: str) -> bool:
            try:
                desc = await client.get_workflow_handle(workflow_id).describe()
            except Exception:  # finished and gone, or unreadable: nothing to tell
                return False
            return any(p.activity_type.name == ACT_AGENT and p.last_worker_identity == dead.identity
                       for p in desc.raw_description.pending_activities)

        kept: list[tuple[str, int]] = []
        for i in range(0, len(listed), DESCRIBES_AT_ONCE):
            chunk = listed[i:i + DESCRIBES_AT_ONCE]
            there = await asyncio.gather(*(still_there(w) for w, _ in chunk))
            kept += [pair for pair, keep in zip(chunk, there, strict=True) if keep]
        return encode_running(kept)
