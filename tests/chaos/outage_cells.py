"""Outage cells of the fault matrix: the store or the Temporal server away, with a trainer attached.

Three cells, each a small durable batch on real worker processes (``chaos_cells.Workers``):

- ``s3_down@batch``: the S3 bucket unreachable for ``OUTAGE_S`` while every rollout's agent runs;
- ``s3_down@stream``: the same once a trainer (``outage_trainer.py``, its own process) applied
  and acknowledged its first group of a streamed job;
- ``restart_server@stream``: the cell's own Temporal dev server SIGKILLed at that moment and
  restarted on its sqlite file.

The bucket is moto's S3 server behind an :class:`OutageProxy` (``AWS_ENDPOINT_URL`` points at the
proxy), so "unreachable" is a refused connection and every open one cut, as when a store's
endpoint goes away. Per cell, counted from evidence outside the code under test (env-side grade
logs, the trainer's own log, substrate dirs, /proc): lost (rollouts without a good result, groups
the trainer never applied), doubled (rows graded more often than they ran, groups applied twice),
leaked (substrates left), wrong (a bad status or reward).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from chaos_cells import Outcome, Workers, _rows, env_servers_of
from temporal_helpers import ENV_FILE, CountingAgent, DevServer, async_wait_for, read_lines

from durable_rollouts.runtimes import SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.connection import connect_client

HERE = Path(__file__).resolve().parent
OUTAGE_CELLS = ["s3_down@batch", "s3_down@stream", "restart_server@stream"]
OUTAGE_S = float(os.environ.get("ROLLOUTS_OUTAGE_S", "30"))


class OutageProxy:
    """A TCP forwarder to ``127.0.0.1:target_port`` that can go away for a while (:meth:`down`).

    It runs on its own thread and event loop: the test's loop may block on a synchronous store
    read (a trace), which must still reach the bucket through this proxy.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.outages = 0
        self.server: asyncio.AbstractServer | None = None
        self.transports: set[asyncio.BaseTransport] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="outage-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)

    async def down(self, seconds: float) -> None:
        """Refuse every connection and cut the open ones for ``seconds``, then serve again."""
        self.outages += 1
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._down(seconds), self.loop))

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
        for transport in list(self.transports):
            transport.abort()

    async def _down(self, seconds: float) -> None:
        await self._cut()
        await asyncio.sleep(seconds)
        await self._listen()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.transport.abort()
            return
        self.transports |= {cw.transport, sw.transport}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            with contextlib.suppress(Exception):
                w.write_eof()

        try:
            await asyncio.gather(pipe(cr, sw), pipe(sr, cw))
        finally:
            for w in (cw, sw):
                self.transports.discard(w.transport)
                w.transport.abort()


def _trainer(address: str, job_id: str, log: Path, home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, ROLLOUTS_HOME=str(home), PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parent / "temporal"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "outage_trainer.py"), address, job_id, str(log)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _events(log: Path, event: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, read_lines(log)) if line["event"] == event]


async def run_outage_cell(cell: str, address: str, workdir: Path, *, proxy: OutageProxy | None,
                          rows: int = 3, group: int = 2, timeout: float = 300.0) -> Outcome:
    """Run one outage cell and count the damage (``proxy``: the bucket's, for the S3 cells)."""
    assert cell in OUTAGE_CELLS, cell
    t0 = time.monotonic()
    stream = cell.endswith("@stream")
    out = Outcome(cell, rows * group)
    home = out.home = workdir / f"{cell.replace('@', '-')}-{uuid.uuid4().hex[:6]}"
    evidence = home / "evidence"
    evidence.mkdir(parents=True)
    queue = f"outage-{uuid.uuid4().hex[:10]}"
    agents, trainer_log = evidence / "agents.log", evidence / "trainer.log"
    server: DevServer | None = None
    if cell == "restart_server@stream":  # its own server: the shared one serves other tests
        server = DevServer(home / "temporal.db")
        await asyncio.to_thread(server.start)
        address = server.address
    client = await connect_client(address)
    workers = Workers(address, queue, {"ROLLOUTS_HOME": str(home)})
    trainer: subprocess.Popen[str] | None = None
    try:
        await workers.start()
        taskset = Taskset("outage", _rows(evidence, rows, False, 0.0))
        agent = CountingAgent(answer="x", seconds=2.0, log=str(agents))
        runtime = SubprocessRuntime(ENV_FILE)
        if stream:  # two at a time: the stream is mid-way when the fault comes
            live = await taskset.start(agent, runtime=runtime, group=group, max_concurrent=2,
                                       temporal=client, worker=False, task_queue=queue,
                                       consumers=["trainer"], linger_s=timeout)
            job_id, wait = live.id, live.wait
            trainer = _trainer(address, job_id, trainer_log, home)
        else:
            handle = await start_job(taskset, agent, runtime=runtime, group=group,
                                     max_concurrent=rows * group, temporal=client, worker=False,
                                     task_queue=queue)
            job_id, wait = handle.job.id, handle.wait
        job_task = asyncio.ensure_future(wait())
        try:
            await _inject(cell, agents, trainer_log, proxy, server, job_task)
            if trainer is not None:
                await asyncio.wait_for(asyncio.to_thread(trainer.wait), timeout)
            job = await asyncio.wait_for(job_task, timeout)
        except (TimeoutError, AssertionError) as exc:
            out.lost = rows * group
            out.notes.append(f"batch did not finish: {type(exc).__name__} {exc}")
            job_task.cancel()
            job = None
        if job is not None:
            _check(out, job.runs, evidence, rows, group)
            _check_reruns(out, cell, agents)
        if stream:
            _check_trainer(out, trainer_log, {r.group_id for r in job.runs} if job else set(), rows)
    finally:
        if trainer is not None and trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait(10)
        await workers.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)
    dirs = [p.name for p in (home / "substrates").glob("*") if p.is_dir()]
    procs = env_servers_of(home)
    out.leaked += len(dirs) + len(procs)
    if dirs or procs:
        out.notes.append(f"leaked dirs={dirs} procs={procs}")
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out.seconds = time.monotonic() - t0
    return out


async def _inject(cell: str, agents: Path, trainer_log: Path, proxy: OutageProxy | None,
                  server: DevServer | None, job: asyncio.Future[Any]) -> None:
    if cell == "s3_down@batch":
        await async_wait_for(lambda: read_lines(agents) or job.done(), timeout=90, what="agent start")
    else:  # mid-stream: the trainer applied and acknowledged a group, rollouts still run
        await async_wait_for(lambda: _events(trainer_log, "ack") or job.done(), timeout=120,
                             what="first acknowledged group")
    if job.done():
        raise AssertionError(f"the batch ended before the fault of {cell}")
    if cell.startswith("s3_down"):
        assert proxy is not None
        await proxy.down(OUTAGE_S)
    else:
        assert server is not None
        await asyncio.to_thread(server.stop, signal.SIGKILL)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)


def _check(out: Outcome, runs: list[Any], evidence: Path, rows: int, group: int) -> None:
    out.lost += rows * group - len(runs)
    for i in range(rows):
        grades = len(read_lines(evidence / f"grades-{i}.log"))
        if grades > group:
            out.double += grades - group
            out.notes.append(f"row {i}: {grades} grades for {group} rollouts")
    for run in runs:
        out.results.append((run.status, run.reward, run.attempts, (run.error or "")[:200]))
        if run.status != "succeeded" or run.reward != 1.0:
            out.wrong += 1
            out.notes.append(f"{run.rollout_id} {run.status} reward={run.reward} "
                             f"error={(run.error or '')[:300]}")


def _check_reruns(out: Outcome, cell: str, agents: Path) -> None:
    """A bucket outage shorter than ``ROLLOUTS_STORAGE_PATIENCE`` costs no agent re-run: the
    trace write waits the store out (``temporal.storage.patiently``)."""
    runs: dict[str, int] = {}
    for line in read_lines(agents):
        rid = line.split()[1]
        runs[rid] = runs.get(rid, 0) + 1
    again = {rid: n for rid, n in runs.items() if n > 1}
    out.notes.append(f"agent runs {sum(runs.values())} for {len(runs)} rollouts")
    if again and cell.startswith("s3_down"):
        out.wrong += len(again)
        out.notes.append(f"agents run again by the outage: {again}")


def _check_trainer(out: Outcome, log: Path, groups: set[str], rows: int) -> None:
    applied = [g for line in _events(log, "apply") for g in line["groups"]]
    twice = {g for g in applied if applied.count(g) > 1}
    missing = (groups or {f"row {i}" for i in range(rows)}) - set(applied)
    out.double += len(twice)
    out.lost += len(missing)
    errors = _events(log, "error")
    out.notes.append(f"trainer applied {len(set(applied))} groups, {len(errors)} errors survived")
    if twice or missing:
        out.notes.append(f"trainer applied twice {sorted(twice)}, never {sorted(missing)}")
