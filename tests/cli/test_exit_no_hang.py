"""Issue #16: a script or command that ran a batch on the embedded server exits promptly.

The in-process worker must be stopped before ``asyncio.run``'s final cancellation (which would
wedge temporalio's Worker for ever). Four kinds of scripts run as real subprocesses, several at
once, on one shared embedded dev server (as users run them) while a busy-loop process competes
for the CPU: the issue's script, the README's Python quick start, a ``Job.start`` training loop
of two batches, and ``rollouts run``. Each must exit cleanly within ``EXIT_S`` of printing its
result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import cli_env, rollouts_cmd
from test_readme import REPO, python_blocks

pytestmark = pytest.mark.timeout(480)  # ~1 min on a quiet 2-core machine; minutes under heavy load

EXIT_S = 10.0  # from printing the result to the process's exit
RUN_S = 120.0  # a whole run, result included (generous: the machine is loaded on purpose)
PARALLEL = 6

ENV = '''
from durable_rollouts import Environment
env = Environment(name="adder")

@env.template()
async def add(a: int, b: int):
    answer = yield f"What is {a} + {b}?"
    yield 1.0 if str(answer).strip() == str(a + b) else 0.0

tasks = [add(a=i, b=i + 1) for i in range(7)]
'''

AGENT = '''
from durable_rollouts import Agent

class Simple(Agent):
    async def __call__(self, run):
        run.trace.content = "1"
'''

ISSUE = '''
import asyncio
from durable_rollouts import Agent, LocalRuntime, Taskset

class Simple(Agent):
    async def __call__(self, run):
        run.trace.content = "1"

async def main():
    ts = Taskset.from_file("env.py")
    job = await ts.run(Simple(), runtime=LocalRuntime("env.py"), group=2, max_concurrent=8)
    print("RESULT runs", len(job.runs), flush=True)

asyncio.run(main())
'''

# The README blocks run with top-level await inside asyncio.run, classes in __main__.
AWAIT_RUNNER = '''
import ast, asyncio, sys
source = open(sys.argv[1]).read()
code = compile(source, sys.argv[1], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

async def main():
    try:
        pending = eval(code, globals())
        if pending is not None:
            await pending
    except Exception:
        if "job" in globals():  # which runs failed, and why
            print([(r.status, r.error) for r in job.runs if r.error][:3], file=sys.stderr)
        raise
    print("RESULT", len(job.runs), flush=True)

asyncio.run(main())
'''


@dataclass
class Outcome:
    kind: str
    code: int | None
    result: bool  # printed its result line
    exit_after_s: float | None  # from the result line to the exit
    took_s: float  # the whole run
    err: str


def _scripts(tmp: Path) -> dict[str, tuple[list[str], Path]]:
    """kind -> (argv, cwd) of each script, written to ``tmp``."""
    (tmp / "env.py").write_text(ENV)
    (tmp / "simple_agent.py").write_text(AGENT)
    (tmp / "issue.py").write_text(ISSUE)
    (tmp / "await_runner.py").write_text(AWAIT_RUNNER)
    batch, loop = python_blocks("A batch from Python")
    assert "range(10)" in loop
    (tmp / "readme.py").write_text(batch)
    (tmp / "loop.py").write_text("\n".join([
        "from durable_rollouts import LocalRuntime, Taskset",
        "from simple_agent import Simple",
        f"taskset = Taskset('loop', list(Taskset.from_file({str(tmp / 'env.py')!r}))[:2])",
        f"agent, runtime = Simple(), LocalRuntime({str(tmp / 'env.py')!r})",
        loop.replace("range(10)", "range(2)"),
        "job = session",
        "assert len(job.runs) == 2 * 2 * 8, len(job.runs)",
    ]))
    runner = [sys.executable, str(tmp / "await_runner.py")]
    return {
        "issue": ([sys.executable, "issue.py"], tmp),
        "readme": ([*runner, str(tmp / "readme.py")], REPO),  # the README's paths are repo-relative
        "loop": ([*runner, str(tmp / "loop.py")], tmp),
        "cli": ([*rollouts_cmd(), "run", "env.py", "--agent", "simple_agent:Simple", "--json"], tmp),
    }


def _run(index: int, kind: str, argv: list[str], cwd: Path, tmp: Path) -> Outcome:
    # One server, and a chosen task queue per run (without one, each job gets its own queue:
    # tests/cli/test_two_experiments.py); a shared one would mix concurrent scripts' rollouts.
    env = cli_env(PYTHONFAULTHANDLER="1", ROLLOUTS_TASK_QUEUE=f"exit-no-hang-{index}",
                  PYTHONPATH=os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    printed: list[float] = []
    err: list[str] = []
    marker = '"job_id"' if kind == "cli" else "RESULT"

    def read_out() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if marker in line and not printed:
                printed.append(time.monotonic())

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]  # type: ignore[union-attr]
    for t in readers:
        t.start()
    deadline = time.monotonic() + RUN_S
    while proc.poll() is None and time.monotonic() < (printed[0] + EXIT_S if printed else deadline):
        time.sleep(0.05)
    code = proc.poll()
    if code is None:  # hung: faulthandler prints every thread's stack on SIGABRT
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(10)
    exited = time.monotonic()
    after = exited - printed[0] if printed and code is not None else None
    return Outcome(kind, code, bool(printed), after, exited - started, "".join(err)[-3000:])


def test_scripts_and_cli_exit_promptly_after_a_batch_under_cpu_load(embedded_server, tmp_path: Path) -> None:
    """Every run (20 of the issue's script, 6 README quick starts, 6 two-batch training loops,
    4 ``rollouts run``; 6 at a time, one shared embedded server, a CPU hog running) prints its
    result, exits 0 and exits within EXIT_S of printing it: nothing left behind blocks the loop's end."""
    scripts = _scripts(tmp_path)
    plan = ["issue"] * 20 + ["readme"] * 6 + ["loop"] * 6 + ["cli"] * 4
    plan = plan[::3] + plan[1::3] + plan[2::3]  # interleave the kinds
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            outcomes = list(pool.map(lambda ik: _run(ik[0], ik[1], *scripts[ik[1]], tmp_path),
                                     enumerate(plan)))
    finally:
        hog.kill()
        hog.wait()
    bad = [o for o in outcomes if not (o.code == 0 and o.result and o.exit_after_s is not None)]
    assert not bad, "\n\n".join(f"{o.kind}: code {o.code}, result printed {o.result}\n{o.err}" for o in bad[:3])
    slowest = max(o.exit_after_s or 0.0 for o in outcomes)
    assert len(outcomes) == len(plan) and slowest <= EXIT_S
    for kind in sorted(set(plan)):
        mine = [o for o in outcomes if o.kind == kind]
        print(f"{kind}: {len(mine)} runs, exit after the result max "
              f"{max(o.exit_after_s or 0.0 for o in mine):.2f} s, run max {max(o.took_s for o in mine):.1f} s")
