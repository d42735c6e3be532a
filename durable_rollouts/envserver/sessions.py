"""Control-channel sessions: live, parked (with a TTL) and closed.

A :class:`Session` is bound to at most one connection. When that connection drops the session is
*parked*: its task (if any) stays suspended until a client resumes it with ``hello{session_id}``,
adopts its task with a plain ``tasks.grade``, or the park TTL expires and the task's teardown
runs. :class:`SessionTable` owns every session and enforces the legal transitions.

No sockets here; imports only ``runner.py`` and the shared errors module.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from enum import Enum

from ..errors import InvalidStateError
from .runner import TaskRunner

__all__ = ["Session", "SessionState", "SessionTable"]

log = logging.getLogger(__name__)


class SessionState(Enum):
    LIVE = "live"
    PARKED = "parked"
    CLOSED = "closed"


_ALLOWED: dict[SessionState, set[SessionState]] = {
    SessionState.LIVE: {SessionState.PARKED, SessionState.CLOSED},
    SessionState.PARKED: {SessionState.LIVE, SessionState.CLOSED},
    SessionState.CLOSED: set(),
}


class Session:
    """One client session and its (optional) task runner."""

    def __init__(self, id: str, owner: int | None = None) -> None:
        self.id = id
        self.owner = owner  # which server token created it (None without tokens)
        self.state = SessionState.LIVE
        self.runner: TaskRunner | None = None
        self.start_key: str | None = None  # the key its task was started under, if any
        self._expiry: asyncio.Task[None] | None = None

    def transition(self, new: SessionState) -> None:
        """Move to ``new``; raises ``InvalidStateError`` for an illegal transition."""
        if new not in _ALLOWED[self.state]:
            raise InvalidStateError(f"session {self.id}: cannot go from {self.state.value} to {new.value}")
        self.state = new

    async def replace_runner(self, runner: TaskRunner | None) -> None:
        """Install a new runner, closing (tearing down) the previous one."""
        old, self.runner = self.runner, runner
        if old is not None:
            await old.close()


class SessionTable:
    """Every session of one server, with parking and TTL expiry.

    Args:
        park_ttl_s: how long a parked session lives before its teardown runs.
        max_idle_parked: parked sessions that never started a task (a ``hello`` and a disconnect)
            kept at most; beyond it the longest-parked are closed, so such clients cannot grow
            the table for a whole TTL. Sessions holding a task (or a grade) are never evicted.
    """

    def __init__(self, park_ttl_s: float = 3600.0, max_idle_parked: int = 4096) -> None:
        self.park_ttl_s = park_ttl_s
        self.max_idle_parked = max_idle_parked
        self._sessions: dict[str, Session] = {}
        self._idle_parked: dict[str, Session] = {}  # in parking order
        self._by_start_key: dict[str, Session] = {}  # tasks.start's start_key -> its session

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def started_under(self, start_key: str, owner: int | None) -> Session | None:
        """The open session of token ``owner`` whose task was started under ``start_key``."""
        session = self._by_start_key.get(start_key)
        return session if session is not None and session.owner == owner else None

    def remember_start(self, start_key: str, session: Session) -> None:
        """``session``'s task was started under ``start_key`` (forgotten when it closes)."""
        if session.start_key is not None:
            self._forget_start(session)
        session.start_key = start_key
        self._by_start_key[start_key] = session

    def _forget_start(self, session: Session) -> None:
        if session.start_key is not None and self._by_start_key.get(session.start_key) is session:
            del self._by_start_key[session.start_key]
        session.start_key = None

    def create(self, owner: int | None = None) -> Session:
        """A new live session with a fresh id, bound to token ``owner``."""
        while True:
            sid = f"sess-{secrets.token_hex(8)}"
            if sid not in self._sessions:
                break
        session = Session(sid, owner)
        self._sessions[sid] = session
        return session

    def park(self, session: Session) -> None:
        """The connection dropped: keep the session until resumed or expired."""
        if session.state is not SessionState.LIVE:
            return
        session.transition(SessionState.PARKED)
        session._expiry = asyncio.create_task(self._expire_later(session))
        if session.runner is None:
            self._idle_parked[session.id] = session
            while len(self._idle_parked) > self.max_idle_parked:
                oldest = self._idle_parked.pop(next(iter(self._idle_parked)))
                log.info("closing idle parked session %s (more than %d)", oldest.id, self.max_idle_parked)
                self._close_idle(oldest)

    def resume(self, session: Session) -> None:
        """Bind a parked session to a new connection (stops its TTL clock)."""
        session.transition(SessionState.LIVE)
        self._idle_parked.pop(session.id, None)
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None

    def parked_with_task(self) -> list[Session]:
        """Parked sessions that hold a task not yet graded (candidates for adoption)."""
        return [
            s
            for s in self._sessions.values()
            if s.state is SessionState.PARKED and s.runner is not None and not s.runner.graded
        ]

    def tasks_in_progress(self, *, excluding: Session | None = None) -> int:
        """How many sessions, live or parked, hold a task in progress (``excluding`` not counted)."""
        return sum(
            1
            for s in self._sessions.values()
            if s is not excluding and s.runner is not None and s.runner.in_progress
        )

    async def close(self, session: Session) -> None:
        """Forget the session and tear its task down."""
        if session.state is SessionState.CLOSED:
            return
        session.transition(SessionState.CLOSED)
        self._sessions.pop(session.id, None)
        self._idle_parked.pop(session.id, None)
        self._forget_start(session)
        if session._expiry is not None and session._expiry is not asyncio.current_task():
            session._expiry.cancel()
        session._expiry = None
        await session.replace_runner(None)

    async def close_all(self) -> None:
        """Close every session (server shutdown)."""
        for session in list(self._sessions.values()):
            try:
                await self.close(session)
            except Exception:
                log.exception("closing session %s failed", session.id)

    def _close_idle(self, session: Session) -> None:
        """Close a task-less parked session now (nothing to tear down, so no await needed)."""
        session.transition(SessionState.CLOSED)
        self._sessions.pop(session.id, None)
        self._forget_start(session)
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None

    async def _expire_later(self, session: Session) -> None:
        await asyncio.sleep(self.park_ttl_s)
        if session.state is SessionState.PARKED:
            log.info("parked session %s expired after %.1f s", session.id, self.park_ttl_s)
            await self.close(session)
