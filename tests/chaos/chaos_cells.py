"""The fault-injection matrix: one cell = a small durable batch on real processes + one fault.

Shared by ``tests/chaos`` (one run per cell, in CI) and ``benchmarks/chaos.py`` (many runs).
Every cell runs ``rows`` echo rollouts of ``tests/temporal/counting_env.py`` with worker
*processes* (``temporal_helpers.WorkerProcess``) against a real dev server, injects its fault,
waits for the batch and then counts, from evidence on disk and in /proc:

- lost: rollouts without a result (or the batch never finished);
- double: rows whose env (or verifier) graded more than once (one log line per real grade), or
  whose task was set up twice in one env process (one log line per real setup);
- leaked: substrate dirs left under the cell's ROLLOUTS_HOME plus live env-server processes
  started for that home;
- wrong: rollouts whose status/reward differ from the expected outcome.

``kill_mid_turn`` runs a checkpointing agent (``tests/agents/agent_helpers.TurnsAgent``) whose
tool calls the env records (``tests/temporal/turns_env.py``) and SIGKILLs its worker mid-turn,
right after a checkpoint: double also counts turns (side effects) that ran twice, wrong a run
that did not resume.

The ``restart_server`` cell runs on its own dev server, stopped (SIGTERM or SIGKILL) mid-agent
and restarted on the same sqlite file.

The outage cells (the S3 bucket away for 30 s mid-batch and mid-stream, the server SIGKILLed
mid-stream, with a trainer attached) are in ``outage_cells.py`` (run by
``tests/storage/test_outages.py``, which has the bucket).

Each cell gets its own ROLLOUTS_HOME and task queue; a supervisor keeps two live workers (a killed
worker is replaced), so the fault is survived by another process, never by luck of timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_helpers import TurnsAgent
from temporal_helpers import (
    ENV_FILE,
    TURNS_ENV,
    CountingAgent,
    DevServer,
    WorkerProcess,
    async_wait_for,
    read_lines,
)

HERE = Path(__file__).resolve().parent
TEMPORAL_TESTS = HERE.parent / "temporal"
AGENT_TESTS = HERE.parent / "agents"

from durable_rollouts.models import Task
from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT
from durable_rollouts.runtimes import Runtime, SubprocessRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.stores.tracestore import TraceStore
from durable_rollouts.temporal.batches import start_job
from durable_rollouts.temporal.connection import connect_client

# worker SIGKILLed at a fault point (tests/temporal/faults.py, via `python -m fault_worker`) during each step
KILL_POINTS = {
    "kill@provision": "after_provision",
    "kill@connect": "after_connect",
    "kill@start": "after_start",
    "kill@agent": "after_agent",
    "kill@grade": "after_grade",
    "kill@verify": "after_verify",
    "kill@teardown": "before_teardown",
    # after a local teardown, before its workflow task completed: the replayed grade answers
    # from its receipt (stores.grade_receipts); before that the rollout ran again and graded twice
    "kill@torn_down": "after_teardown",
}
CELLS = [*KILL_POINTS, "sigstop_worker", "kill_env_mid_agent", "kill_mid_turn",
         "kill_verifier_substrate", "restart_server", "cut_channel", "disk_full"]
TURNS = 4  # of the kill_mid_turn agent
# ROLLOUTS_AGENT_HEARTBEAT of the tests' matrices: a killed or stopped worker's agent step runs
# again after 5 s, not the default 20 s (tests/temporal/test_survival.py measures that one); a
# cell counts what is lost or done twice, which does not depend on it.
HEARTBEAT = "5"
VERIFIED = {"kill@verify", "kill_verifier_substrate"}


@dataclass
class Outcome:
    cell: str
    rows: int
    lost: int = 0
    double: int = 0
    leaked: int = 0
    wrong: int = 0
    seconds: float = 0.0
    home: Path | None = None
    results: list[tuple[str, Any, int, str]] = field(default_factory=list)  # status, reward, attempts, error
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.double or self.leaked or self.wrong)

    def __str__(self) -> str:
        return (f"{self.cell}: rows={self.rows} lost={self.lost} double={self.double} "
                f"leaked={self.leaked} wrong={self.wrong} ({self.seconds:.1f}s) {'; '.join(self.notes)}")


# ---------------------------------------------------------------------------------------------
# processes


class Workers:
    """Keeps ``count`` live worker processes on one queue; a dead one is replaced."""

    def __init__(self, address: str, queue: str, env: dict[str, str], count: int = 2) -> None:
        self.address, self.queue, self.env, self.count = address, queue, env, count
        self.all: list[WorkerProcess] = []
        self._task: asyncio.Task[None] | None = None

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.all if w.proc.poll() is None]

    async def start(self) -> None:
        started = await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(self.count)))
        self.all.extend(started)
        self._task = asyncio.ensure_future(self._supervise())

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess(self.address, self.queue, env=self.env)

    async def _supervise(self) -> None:
        while True:
            missing = self.count - len(self.live())
            if missing > 0:
                self.all.append(await asyncio.to_thread(self._spawn))
            await asyncio.sleep(0.1)

    def by_pid(self, pid: int) -> WorkerProcess | None:
        return next((w for w in self.all if w.pid == pid), None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for w in self.all:
            with contextlib.suppress(ProcessLookupError):
                if w.proc.poll() is None:
                    os.kill(w.pid, signal.SIGCONT)  # a stopped worker cannot handle SIGTERM
            await asyncio.to_thread(w.stop)


def env_servers_of(home: Path) -> list[int]:
    """Live env-server processes started with ``ROLLOUTS_HOME=home`` (leak detection)."""
    found = []
    want = f"ROLLOUTS_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"durable_rollouts.envserver" not in (entry / "cmdline").read_bytes():
                continue
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


class CuttingProxy:
    """A TCP proxy that, once, cuts a connection mid-frame.

    When a client->server chunk contains ``trigger`` (a method name), either half of that chunk
    is forwarded (``mode="request"``) or the request goes through and half of the server's next
    chunk is forwarded (``mode="response"``, the server already acted); then both sides close.
    """

    def __init__(self, target_port: int, trigger: bytes, mode: str = "response") -> None:
        self.target_port, self.trigger, self.mode = target_port, trigger, mode
        self.fired = False
        self.server: asyncio.AbstractServer | None = None
        self.conns: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self.conns):
            t.cancel()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.conns.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        armed = asyncio.Event()   # response mode: cut the next server chunk
        cut = asyncio.Event()

        async def up() -> None:
            while data := await cr.read(65536):
                if not self.fired and self.trigger in data:
                    self.fired = True
                    if self.mode == "request":
                        sw.write(data[: len(data) // 2])
                        await sw.drain()
                        cut.set()
                        return
                    armed.set()
                sw.write(data)
                await sw.drain()
            sw.write_eof() if sw.can_write_eof() else None

        async def down() -> None:
            while data := await sr.read(65536):
                if armed.is_set():
                    cw.write(data[: max(1, len(data) // 2)])
                    await cw.drain()
                    cut.set()
                    return
                cw.write(data)
                await cw.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        waiter = asyncio.ensure_future(cut.wait())
        try:
            await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
            if not cut.is_set():
                await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (*tasks, waiter):
                t.cancel()
            for w in (cw, sw):
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self.conns.discard(asyncio.current_task())  # type: ignore[arg-type]


def _start_env_server(home: Path) -> tuple[subprocess.Popen[bytes], int]:
    log = home / "borrowed-env.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_rollouts.envserver", ENV_FILE, "--env", "counting"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, ROLLOUTS_HOME=str(home)),
            start_new_session=True, cwd=str(TEMPORAL_TESTS))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(SERVE_PORT_ANNOUNCEMENT):
                return proc, int(line[len(SERVE_PORT_ANNOUNCEMENT):].strip())
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"borrowed env server did not start: {log.read_text()}")


# ---------------------------------------------------------------------------------------------
# one cell


def _rows(evidence: Path, n: int, verified: bool, verify_delay: float, source: str = ENV_FILE) -> list[Task]:
    rows = []
    for i in range(n):
        task = Task(env="counting", id="echo", source=source, args={
            "expected": "x", "tag": str(i), "grade_log": str(evidence / f"grades-{i}.log"),
            "pid_file": str(evidence / f"env-{i}.pid"), "start_log": str(evidence / f"starts-{i}.log")})
        if verified:
            task = task.model_copy(update={"verifier": Task(env="referee", id="referee", source=ENV_FILE, args={
                "expected": "x", "grade_log": str(evidence / f"referee-{i}.log"),
                "pid_file": str(evidence / f"referee-{i}.pid"), "delay": verify_delay})})
        rows.append(task)
    return rows


def _disk_full(traces: Path) -> None:
    from durable_rollouts.temporal import storage

    traces.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(traces)], check=True)
    (traces / "keep.json").write_text('{"intact": true}')
    storage.LOOP.run(storage.probe(f"file://{traces}"))  # the workers' start-up probe object
    with contextlib.suppress(OSError), open(traces / "filler", "wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()


async def run_cell(cell: str, client: Any, address: str, workdir: Path, *, rows: int = 2,
                   timeout: float = 120.0, variant: int = 0) -> Outcome:
    """Run one cell (``variant`` varies the details in the long benchmark) and count the damage."""
    assert cell in CELLS, cell
    t0 = time.monotonic()
    out = Outcome(cell, rows)
    home = out.home = workdir / f"{cell.replace('@', '-')}-{uuid.uuid4().hex[:6]}"
    evidence = home / "evidence"
    evidence.mkdir(parents=True)
    queue = f"chaos-{uuid.uuid4().hex[:10]}"
    agents = evidence / "agents.log"
    env = {"ROLLOUTS_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(AGENT_TESTS), os.environ.get("PYTHONPATH", "")])}
    seconds = 0.3
    verify_delay = 0.0
    if cell in KILL_POINTS:
        env.update(ROLLOUTS_FAULTS=KILL_POINTS[cell], ROLLOUTS_FAULTS_DIR=str(evidence))
    if cell in ("sigstop_worker", "kill_env_mid_agent", "restart_server"):
        seconds = 3.0
    if cell == "kill_verifier_substrate":
        verify_delay = 2.0
    source = TURNS_ENV if cell == "kill_mid_turn" else ENV_FILE  # its tool calls: the env's side effects
    runtime: Any = SubprocessRuntime(source)
    proxy: CuttingProxy | None = None
    borrowed: subprocess.Popen[bytes] | None = None
    mounted = False
    server: DevServer | None = None
    if cell == "restart_server":  # its own server: restarting the shared one would hit other cells
        server = DevServer(home / "temporal.db")
        await asyncio.to_thread(server.start)
        client = await connect_client(server.address)
        address = server.address
    workers = Workers(address, queue, env)
    stopped: int | None = None
    try:
        if cell == "cut_channel":
            borrowed, port = await asyncio.to_thread(_start_env_server, home)
            trigger, mode = [(b'"tasks.grade"', "response"), (b'"tasks.grade"', "request"),
                             (b'"tasks.start"', "response"), (b'"tasks.start"', "request"),
                             (b'"hello"', "response")][variant % 5]
            proxy = CuttingProxy(port, trigger, mode)
            await proxy.start()
            runtime = Runtime(f"tcp://127.0.0.1:{proxy.port}")
            out.notes.append(f"cut {trigger.decode()} {mode}")
        if cell == "disk_full":
            _disk_full(home / "storage")  # where traces are written (the file storage driver)
            mounted = True
        await workers.start()
        agent: Any = CountingAgent(answer="x", seconds=seconds, log=str(agents))
        if cell == "kill_mid_turn":
            agent = TurnsAgent(turns=TURNS, think_s=0.6, log=str(evidence / "turns.log"), tool=True)
        handle = await start_job(Taskset("chaos", _rows(evidence, rows, cell in VERIFIED, verify_delay, source)),
                                 agent,
                                 runtime=runtime, temporal=client, worker=False, task_queue=queue,
                                 max_concurrent=rows, trace_store=TraceStore(home / "traces"))
        job_task = asyncio.ensure_future(handle.wait())
        try:
            await _inject(cell, evidence, workers, job_task, server=server, variant=variant)
            stopped = getattr(workers, "stopped_pid", None)
            out.killed_rollout = getattr(workers, "killed_rollout", None)  # type: ignore[attr-defined]
            job = await asyncio.wait_for(job_task, timeout)
        except (TimeoutError, AssertionError) as exc:
            out.lost = rows
            out.notes.append(f"batch did not finish: {type(exc).__name__} {exc}")
            job_task.cancel()
            with contextlib.suppress(BaseException):
                await handle.cancel()
            job = None
        if job is not None:
            _check(out, cell, job.runs, evidence, rows, home)
        if proxy is not None and not proxy.fired:
            out.notes.append("proxy never fired")
            out.wrong += 1
    finally:
        await workers.stop()
        if proxy is not None:
            await proxy.close()
        if borrowed is not None:
            borrowed.kill()
            borrowed.wait(10)
        if mounted:
            await asyncio.to_thread(subprocess.run, ["umount", "-l", str(home / "storage")], check=False)
        if server is not None:
            await asyncio.to_thread(server.stop)
    # leaks: after the batch finished (and the workers stopped) nothing may be left for this home
    dirs = [p.name for p in (home / "substrates").glob("*") if p.is_dir()] if (home / "substrates").exists() else []
    procs = env_servers_of(home)
    verdicts = [p.name for p in (home / "verdicts").glob("*")] if (home / "verdicts").exists() else []
    out.leaked += len(dirs) + len(procs) + len(verdicts)
    if dirs or procs or verdicts:
        out.notes.append(f"leaked dirs={dirs} procs={procs} verdicts={verdicts}")
    for pid in procs:  # clean up after a leak so the next cell starts clean
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if stopped is not None:
        out.notes.append(f"zombie worker {stopped} resumed")
    out.seconds = time.monotonic() - t0
    return out


async def _inject(cell: str, evidence: Path, workers: Workers, job: asyncio.Future[Any], *,
                  server: DevServer | None = None, variant: int = 0) -> None:
    agents = evidence / "agents.log"
    if cell in KILL_POINTS:
        marker = evidence / f"{KILL_POINTS[cell]}.fired"
        await async_wait_for(lambda: marker.exists() or job.done(), timeout=90, what=f"fault {cell}")
        if not marker.exists():
            raise AssertionError(f"fault point {KILL_POINTS[cell]} never fired")
    elif cell == "sigstop_worker":
        await async_wait_for(lambda: read_lines(agents), timeout=60, what="agent start")
        pid, rid = read_lines(agents)[0].split()
        os.kill(int(pid), signal.SIGSTOP)
        workers.stopped_pid = int(pid)  # type: ignore[attr-defined]
        workers.count += 1  # a stopped worker still counts as live: add one more
        try:
            # the retry on another worker proves the heartbeat timeout passed while it was stopped
            await async_wait_for(lambda: any(line.split()[1] == rid and line.split()[0] != pid
                                             for line in read_lines(agents)) or job.done(),
                                 timeout=180, what="agent retry elsewhere")
        finally:
            os.kill(int(pid), signal.SIGCONT)
    elif cell == "kill_env_mid_agent":
        pid_file = evidence / "env-0.pid"
        await async_wait_for(lambda: bool(read_lines(agents)) and pid_file.exists(), timeout=60,
                             what="agent start")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    elif cell == "kill_mid_turn":  # right after a checkpoint, while the next turn "thinks"
        cps = evidence / "turns.log.cp"
        turn = 1 + variant % (TURNS - 1)
        await async_wait_for(lambda: any(int(line.split()[1]) >= turn for line in read_lines(cps)),
                             timeout=60, what=f"turn {turn} checkpointed")
        line = next(line for line in read_lines(cps) if int(line.split()[1]) >= turn)
        worker = workers.by_pid(int(line.split()[2]))
        workers.killed_rollout = line.split()[0]  # type: ignore[attr-defined]
        if worker is not None:
            await asyncio.to_thread(worker.kill)
    elif cell == "kill_verifier_substrate":
        pid_file = evidence / "referee-0.pid"
        await async_wait_for(pid_file.exists, timeout=60, what="verifier grading")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    elif cell == "restart_server":
        assert server is not None
        await async_wait_for(lambda: read_lines(agents), timeout=60, what="agent start")
        # a clean stop or a crash of the server, then a restart on the same sqlite file and port
        await asyncio.to_thread(server.stop, (signal.SIGTERM, signal.SIGKILL)[variant % 2])
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)


def _cell_trace(home: Path, run: Any) -> Any:
    """``run``'s trace from the cell's own store (its workers' ``file://HOME/storage``)."""
    from durable_rollouts.stores.tracestore import TraceStore
    from durable_rollouts.temporal import storage

    driver = storage.build_driver(storage.parse_storage_url(f"file://{home / 'storage'}"))
    return TraceStore(blobs=storage.Blobs(driver=driver)).get(run.trace_ref)


def _check(out: Outcome, cell: str, runs: list[Any], evidence: Path, rows: int, home: Path) -> None:
    by_row = {r.row_index if hasattr(r, "row_index") else i: r for i, r in enumerate(runs)}
    out.lost += rows - len(runs)
    if len(runs) != rows:
        out.notes.append(f"{len(runs)} runs for {rows} rows")
    for i in range(rows):
        grades = len(read_lines(evidence / f"grades-{i}.log"))
        referee = len(read_lines(evidence / f"referee-{i}.log"))
        if grades > 1 or referee > 1:
            out.double += 1
            out.notes.append(f"row {i}: {grades} grades, {referee} verifier grades")
        pids = [line.split()[-1] for line in read_lines(evidence / f"starts-{i}.log")]
        if len(set(pids)) < len(pids):  # a task set up twice in one env (a new env may set up anew)
            out.double += 1
            out.notes.append(f"row {i}: setups in env processes {pids}")
    if cell == "kill_mid_turn":  # every turn's side effect exactly once, and the kill was survived
        turns: dict[str, list[int]] = {}
        for line in read_lines(evidence / "turns.log"):
            rid, turn, _ = line.split()
            turns.setdefault(rid, []).append(int(turn))
        for rid, seen in turns.items():
            if seen != list(range(1, TURNS + 1)):
                out.double += 1
                out.notes.append(f"{rid}: turns {seen}")
        killed = getattr(out, "killed_rollout", None)
        for run in runs:
            if run.rollout_id == killed and _cell_trace(home, run).extra.get("resumed") != 1:
                out.wrong += 1
                out.notes.append(f"{killed} did not resume from its checkpoint")
    for run in by_row.values():
        out.results.append((run.status, run.reward, run.attempts, (run.error or "")[:200]))
        if run.status is None or run.status == "running":
            out.lost += 1
            continue
        if cell == "disk_full":
            good = run.status == "errored" and "No space left on device" in (run.error or "")
        else:
            good = run.status == "succeeded" and run.reward == 1.0
            if cell == "kill_env_mid_agent" and run.error and "attempt 1" not in run.error:
                good = False
        if not good:
            out.wrong += 1
            out.notes.append(f"{run.status} reward={run.reward} error={(run.error or '')[:300]}")
    if cell == "disk_full":
        traces = home / "storage"
        leftovers = [p.name for p in traces.rglob(".tmp-*")]
        intact = (traces / "keep.json").read_text() == '{"intact": true}'
        if leftovers or not intact:
            out.wrong += 1
            out.notes.append(f"trace store corrupted: tmp={leftovers} intact={intact}")


async def run_matrix(jobs: list[tuple[str, int]], client: Any, address: str, workdir: Path, *,
                     lanes: int = 2, rows: int = 2, timeout: float = 120.0, deadline: float | None = None,
                     report: Any = None) -> list[Outcome]:
    """Run ``jobs`` ((cell, variant) pairs) ``lanes`` at a time; stop starting new ones after
    ``deadline`` (time.monotonic()). ``report(outcome)`` is called as each cell finishes."""
    pending = list(jobs)
    outcomes: list[Outcome] = []

    async def lane() -> None:
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                return
            cell, variant = pending.pop(0)
            out = await run_cell(cell, client, address, workdir, rows=rows, timeout=timeout, variant=variant)
            outcomes.append(out)
            if report is not None:
                report(out)

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return outcomes
