"""Record golden workflow histories of this release: ``python tests/golden/record.py``.

Runs a handful of small batches (trivial agents, the test envs) on a fresh Temporal dev server
and saves, per scenario, every run of each ``TasksetRun`` chain (continue-as-new, resume) and
the ``Rollout`` children those runs started, as temporalio history JSON, plus ``manifest.json``
naming the release (version + commit) and each file. ``test_replay_golden.py`` replays every
directory under ``tests/golden/`` against the current workflows, so each release adds its own::

    python tests/golden/record.py --out tests/golden/<version>-<commit>

Run it from a clean checkout of the release (``durable_rollouts/`` must match the commit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEMPORAL_TESTS = ROOT / "tests" / "temporal"
CLI_TESTS = ROOT / "tests" / "cli"
VERIFIER = ROOT / "examples" / "verifier"
# This checkout's package, the test helpers and the verifier example, for this process and every
# worker or env it starts: run as a script, the process starts itself once more with them on
# PYTHONPATH (the way its subprocesses get them) instead of editing sys.path.
SEARCH = os.pathsep.join(str(p) for p in (ROOT, TEMPORAL_TESTS, CLI_TESTS, VERIFIER))
if __name__ == "__main__" and not os.environ.get("PYTHONPATH", "").startswith(SEARCH):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SEARCH, os.environ.get("PYTHONPATH")) if p)
    os.execv(sys.executable, sys.orig_argv)

from temporal_helpers import (  # noqa: E402
    ENV_FILE,
    CountingAgent,
    DevServer,
    WorkerProcess,
    async_wait_for,
    read_lines,
)

from durable_rollouts.models import Task  # noqa: E402
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime  # noqa: E402
from durable_rollouts.sdk.agents import FixedAgent, TableAgent  # noqa: E402
from durable_rollouts.sdk.job import Job  # noqa: E402
from durable_rollouts.sdk.lifetime import session  # noqa: E402
from durable_rollouts.sdk.taskset import Taskset  # noqa: E402
from durable_rollouts.temporal.batches import JobHandle, shutdown_embedded, start_job  # noqa: E402
from durable_rollouts.temporal.connection import connect_client  # noqa: E402

CONTINUED = "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
CHILD_STARTED = "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED"


@dataclass
class Ctx:
    client: Any
    address: str
    evidence: Path
    queue: str = field(default_factory=lambda: f"golden-{uuid.uuid4().hex[:8]}")
    runs: list[tuple[str, str]] = field(default_factory=list)  # (workflow id, first run id)

    def track(self, handle: JobHandle | Any) -> None:
        h = handle.handle if isinstance(handle, JobHandle) else handle
        self.runs.append((h.id, h.result_run_id or h.run_id))


def echo(expected: str, evidence: Path, tag: str = "", **extra: object) -> Task:
    return Task(env="counting", id="echo", source=ENV_FILE, args={
        "expected": expected, "grade_log": str(evidence / "grades.log"), "tag": tag, **extra})


async def scenario_success(ctx: Ctx) -> str:
    ts = Taskset("golden-ok", [echo("a", ctx.evidence, "r0"), echo("b", ctx.evidence, "r1")])
    h = await start_job(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
                        temporal=ctx.client, worker=True, task_queue=ctx.queue)
    ctx.track(h)
    job = await h.wait()
    assert [r.reward for r in job.runs] == [1.0, 1.0, 0.0, 0.0], [r.error for r in job.runs]
    return "2 rows x group 2, FixedAgent, LocalRuntime (local activities); rewards 1,1,0,0"


async def scenario_subprocess(ctx: Ctx) -> str:
    ts = Taskset("golden-sub", [echo("a", ctx.evidence, "s0")])
    h = await start_job(ts, FixedAgent(answer="a"), runtime=SubprocessRuntime(ENV_FILE), group=2,
                        temporal=ctx.client, worker=True, task_queue=ctx.queue)
    ctx.track(h)
    job = await h.wait()
    assert [r.reward for r in job.runs] == [1.0, 1.0], [r.error for r in job.runs]
    return "1 row x group 2 on SubprocessRuntime (an env subprocess per rollout); rewards 1,1"


async def scenario_pinned(ctx: Ctx) -> str:
    from durable_rollouts.worker import build_worker

    ts = Taskset("golden-pinned", [echo("a", ctx.evidence, "q0")])
    async with build_worker(ctx.client, task_queue=ctx.queue, host_queue="auto", process_queue="auto"):
        h = await start_job(ts, FixedAgent(answer="a"), runtime=SubprocessRuntime(ENV_FILE), group=2,
                            temporal=ctx.client, worker=False, task_queue=ctx.queue)
        ctx.track(h)
        job = await h.wait()
    assert [r.reward for r in job.runs] == [1.0, 1.0], [r.error for r in job.runs]
    return ("a worker polling host and process queues (multi-host mode): every step after "
            "provision is a regular activity pinned to the process queue; rewards 1,1")


async def scenario_reprovision(ctx: Ctx) -> str:
    agents, pid_file = ctx.evidence / "agents.log", ctx.evidence / "env.pid"
    ts = Taskset("golden-reprov", [echo("x", ctx.evidence, "p0", pid_file=str(pid_file))])
    h = await start_job(ts, CountingAgent(answer="x", seconds=1.5, log=str(agents)),
                        runtime=SubprocessRuntime(ENV_FILE), temporal=ctx.client, worker=True,
                        task_queue=ctx.queue)
    ctx.track(h)
    await async_wait_for(lambda: len(read_lines(agents)) == 1 and pid_file.exists(), what="agent")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    job = await asyncio.wait_for(h.wait(), 60)
    (run,) = job.runs
    assert (run.status, run.reward, run.attempts) == ("succeeded", 1.0, 2), run.error
    return "env subprocess SIGKILLed mid-agent: SubstrateGone, teardown, reprovision; attempts=2"


async def scenario_worker_killed(ctx: Ctx) -> str:
    agents = ctx.evidence / "agents-wk.log"
    first = WorkerProcess(ctx.address, ctx.queue)
    second = None
    try:
        ts = Taskset("golden-wk", [echo("x", ctx.evidence, "w0")])
        h = await start_job(ts, CountingAgent(answer="x", seconds=2.0, log=str(agents)),
                            runtime=SubprocessRuntime(ENV_FILE), temporal=ctx.client, worker=False,
                            task_queue=ctx.queue)
        ctx.track(h)
        await async_wait_for(lambda: len(read_lines(agents)) == 1, what="agent start")
        first.kill()
        second = WorkerProcess(ctx.address, ctx.queue)
        job = await asyncio.wait_for(h.wait(), 90)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    (run,) = job.runs
    assert (run.status, run.reward) == ("succeeded", 1.0), run.error
    return ("worker process SIGKILLed mid-agent; a second worker retries the agent activity "
            "(heartbeat timeout, attempt 2) on the parked session")


async def scenario_verifier(ctx: Ctx) -> str:
    import tasks  # examples/verifier

    ts = Taskset("golden-verifier", [tasks.separate_env.tasks[0], tasks.same_env.tasks[1]])
    h = await start_job(ts, TableAgent(default="reward"), runtime=LocalRuntime(), temporal=ctx.client,
                        worker=True, task_queue=ctx.queue)
    ctx.track(h)
    job = await h.wait()
    assert [r.reward for r in job.runs] == [1.0, 0.0], [r.error for r in job.runs]
    return "examples/verifier: a separate-env verifier row (reward 1), a same-env one (reward 0)"


async def scenario_cancelled(ctx: Ctx) -> str:
    agents = ctx.evidence / "agents-c.log"
    ts = Taskset("golden-cancel", [echo("x", ctx.evidence, "c0"), echo("x", ctx.evidence, "c1")])
    h = await start_job(ts, CountingAgent(answer="x", seconds=60, log=str(agents)),
                        runtime=SubprocessRuntime(ENV_FILE), temporal=ctx.client, worker=True,
                        task_queue=ctx.queue)
    ctx.track(h)
    await async_wait_for(lambda: len(read_lines(agents)) == 2, what="agents start")
    await h.cancel()
    from temporalio.client import WorkflowFailureError

    try:
        await asyncio.wait_for(h.handle.result(), 30)
    except WorkflowFailureError:  # the cancelled batch ends as cancelled
        return "2 rollouts cancelled mid-agent via the batch: children cancelled, teardown ran"
    raise AssertionError("cancelled batch completed")


async def scenario_continued(ctx: Ctx) -> str:
    ts = Taskset("golden-can", [echo(str(i), ctx.evidence, f"n{i}") for i in range(5)])
    h = await start_job(ts, FixedAgent(answer="1"), runtime=LocalRuntime(ENV_FILE), max_concurrent=2,
                        temporal=ctx.client, worker=True, task_queue=ctx.queue, max_history_events=20)
    ctx.track(h)
    job = await h.wait()
    assert [r.reward for r in job.runs] == [0.0, 1.0, 0.0, 0.0, 0.0], [r.reward for r in job.runs]
    assert (await h.progress()).runs > 1, await h.progress()
    return "5 rows, max_concurrent 2, max_history_events=20: continues-as-new, flushes results"


async def scenario_session(ctx: Ctx) -> str:
    session = await Job.start("golden-session", group=2)
    ts = Taskset("golden-session", [echo("a", ctx.evidence, "j0")])
    for _ in range(2):
        h = await start_job(ts, FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), job=session,
                            temporal=ctx.client, worker=True, task_queue=ctx.queue)
        ctx.track(h)
        await h.wait()
    assert session.batches == 2 and [r.reward for r in session.runs] == [1.0] * 4
    return "Job.start(group=2) then two batches (job-<id>, job-<id>-b1)"


async def scenario_resumed(ctx: Ctx) -> str:
    from flaky_agent import FlakyAgent

    marker = ctx.evidence / "fixed"
    ts = Taskset("golden-resume", [
        Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "", "tag": "ok"}),
        Task(env="counting", id="echo", source=ENV_FILE, args={"expected": "", "tag": "flaky"}),
    ])
    agent = FlakyAgent(fail_ids=["echo"], marker=str(marker))
    async with session():  # the in-process worker must outlive the first batch: resume needs it
        await _resume_after_errors(ctx, ts, agent, marker)
    return "a batch with 2 errored rollouts, then `rollouts resume` re-runs one (a second run, only=...)"


async def _resume_after_errors(ctx: Ctx, ts: Taskset, agent: Any, marker: Path) -> None:
    from durable_rollouts.temporal.jobs import load_job
    from durable_rollouts.temporal.resume import plan_resume, start_resume

    h = await start_job(ts, agent, runtime=LocalRuntime(ENV_FILE), temporal=ctx.client, worker=True,
                        task_queue=ctx.queue)
    ctx.track(h)
    job = await h.wait()
    assert [r.status for r in job.runs] == ["errored", "errored"], [r.error for r in job.runs]
    marker.touch()
    view = await load_job(ctx.client, job.id)
    (plan,) = plan_resume(view, frozenset({"errored"}))
    # keep one errored result, re-run the other (what `rollouts resume JOB` starts, narrowed)
    plan.kept.append(plan.rerun.pop(0).to_result())
    resumed = await start_resume(ctx.client, job.id, plan)
    ctx.track(resumed)
    result = await resumed.result()
    assert result.progress.total == 2 and result.progress.succeeded == 1, result.progress


async def scenario_streamed(ctx: Ctx) -> str:
    ts = Taskset("golden-stream", [echo("a", ctx.evidence, f"t{i}") for i in range(3)])
    more = Taskset("golden-stream", [echo("a", ctx.evidence, f"m{i}") for i in range(2)])
    job = await ts.start(FixedAgent(answer="a"), runtime=LocalRuntime(ENV_FILE), group=2,
                         temporal=ctx.client, worker=True, task_queue=ctx.queue, linger_s=60,
                         consumers=["trainer"], max_in_flight=2, page_size=2)
    ctx.track(job.handle)
    groups = []
    async for batch in job.stream(consumer="trainer", batch_size=1):
        groups.extend(batch.groups)
        if len(groups) == 1:
            await job.add(more)  # stream_add: the added rows run after the job's own
        await batch.ack()
    done = await job.wait()
    assert len(groups) == 5 and len(done.runs) == 10 and {r.reward for r in done.runs} == {1.0}
    return ("a streamed live job (3 rows x group 2, page_size 2, max_in_flight 2): a consumer "
            "reads and acks one group at a time, 2 rows added mid-run (stream_add, continue-as-new "
            "naming the row chain), pages written, the job closes once the consumer caught up")


SCENARIOS: dict[str, Callable[[Ctx], Awaitable[str]]] = {
    "success": scenario_success,
    "subprocess": scenario_subprocess,
    "pinned": scenario_pinned,
    "reprovision": scenario_reprovision,
    "worker_killed": scenario_worker_killed,
    "verifier": scenario_verifier,
    "cancelled": scenario_cancelled,
    "continued_as_new": scenario_continued,
    "session_two_batches": scenario_session,
    "resumed": scenario_resumed,
    "streamed": scenario_streamed,
}


async def _save(client: Any, wid: str, run_id: str, path: Path) -> Any:
    history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
    path.write_text(json.dumps(json.loads(history.to_json()), separators=(",", ":")) + "\n")
    return history


async def save_scenario(ctx: Ctx, name: str, out: Path) -> list[dict[str, Any]]:
    """Every run of each tracked TasksetRun chain and every Rollout child those runs started."""
    files: list[dict[str, Any]] = []
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    children: list[tuple[str, str]] = []
    for wid, run_id in ctx.runs:
        next_run: str | None = run_id
        while next_run:
            fname = f"TasksetRun-{len([f for f in files if f['type'] == 'TasksetRun'])}.json"
            history = await _save(ctx.client, wid, next_run, folder / fname)
            files.append({"file": f"{name}/{fname}", "type": "TasksetRun", "workflow_id": wid,
                          "run_id": next_run, "events": len(history.events)})
            next_run = None
            for event in history.events:
                kind = event.WhichOneof("attributes")
                if kind == "child_workflow_execution_started_event_attributes":
                    ex = event.child_workflow_execution_started_event_attributes.workflow_execution
                    children.append((ex.workflow_id, ex.run_id))
                if kind == "workflow_execution_continued_as_new_event_attributes":
                    next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    for i, (wid, run_id) in enumerate(children):
        fname = f"Rollout-{i}.json"
        history = await _save(ctx.client, wid, run_id, folder / fname)
        files.append({"file": f"{name}/{fname}", "type": "Rollout", "workflow_id": wid,
                      "run_id": run_id, "events": len(history.events)})
    return files


def release_of(commit: str | None) -> tuple[str, str, bool]:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit or "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    clean = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", full, "--", "durable_rollouts"]
                           ).returncode == 0
    return version, full, clean


async def record(out: Path, only: list[str] | None) -> dict[str, Any]:
    version, commit, clean = release_of(None)
    import temporalio

    tmp = Path(tempfile.mkdtemp(prefix="golden-"))
    os.environ["ROLLOUTS_HOME"] = str(tmp / "home")  # traces, results, substrates: throwaway
    server = DevServer(tmp / "temporal.db")
    server.start()
    manifest: dict[str, Any] = {
        "release": {"version": version, "commit": commit, "package_matches_commit": clean},
        "temporalio": temporalio.__version__,
        "recorded_with": "python tests/golden/record.py",
        "scenarios": {},
    }
    try:
        client = await connect_client(server.address)
        for name, fn in SCENARIOS.items():
            if only and name not in only:
                continue
            evidence = tmp / name
            evidence.mkdir()
            ctx = Ctx(client=client, address=server.address, evidence=evidence)
            description = await fn(ctx)
            await shutdown_embedded()
            files = await save_scenario(ctx, name, out)
            manifest["scenarios"][name] = {"description": description, "files": files}
            print(f"{name}: {len(files)} histories", flush=True)
    finally:
        await shutdown_embedded()
        server.stop()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "README.md").write_text(readme(manifest))
    return manifest


def readme(manifest: dict[str, Any]) -> str:
    """The folder's README: the release and one line per scenario (details in manifest.json)."""
    rel = manifest["release"]
    lines = [f"# Golden histories of durable-rollouts {rel['version']} ({rel['commit'][:7]})", "",
             f"Recorded from commit `{rel['commit']}` (version {rel['version']}, temporalio "
             f"{manifest['temporalio']}) by `{manifest['recorded_with']}`; replayed by "
             "`tests/golden/test_replay_golden.py`. Never edit these files: a later release adds "
             "its own folder. `manifest.json` names every file (workflow type, id, run id).", "",
             "Paths inside payloads (task sources, trace files) are the recording machine's; replay "
             "runs no activity, so they are never opened. No secrets: the agents are trivial.", "",
             "| scenario | files | what ran |", "|---|---|---|"]
    for name, sc in manifest["scenarios"].items():
        kinds = [f["type"] for f in sc["files"]]
        count = f"{kinds.count('TasksetRun')} TasksetRun, {kinds.count('Rollout')} Rollout"
        lines.append(f"| `{name}/` | {count} | {sc['description']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default tests/golden/<version>-<short commit>")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    version, commit, clean = release_of(None)
    if not clean:
        print(f"warning: durable_rollouts/ differs from commit {commit[:7]}", file=sys.stderr)
    out = args.out or ROOT / "tests" / "golden" / f"{version}-{commit[:7]}"
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(record(out, args.only))


if __name__ == "__main__":
    main()
