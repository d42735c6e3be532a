"""Issue #39 item 4: two experiments on one machine never cross.

Two scripts run at once as real subprocesses on one embedded dev server, each with its agent class
defined in its own ``__main__`` (so a rollout that crossed to the other script's worker could not
import its agent there). Neither sets a task queue: each in-process worker gets its job's own queue.
Both wait for each other before starting their batch, so the two batches run side by side. Each
must finish with only its own rows, every rollout succeeded, and every agent call made in its own
process (the agents log their pid).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_env

pytestmark = pytest.mark.timeout(300)

ROWS = 12
GROUP = 2

ENV = '''
from durable_rollouts import Environment
env = Environment(name="adder")

@env.template()
async def add(a: int, b: int):
    answer = yield f"What is {a} + {b}?"
    yield 1.0 if str(answer).strip() == str(a + b) else 0.0
'''

SCRIPT = '''
import asyncio, json, os, sys, time
from pathlib import Path
from durable_rollouts import Agent, LocalRuntime, Taskset

TAG, OTHER, BASE, HERE = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])

class Agent_{tag}(Agent):  # lives in this script's __main__ only
    async def __call__(self, run):
        with open(HERE / f"calls-{{TAG}}.log", "a") as log:
            log.write(json.dumps({{"pid": os.getpid(), "a": run.task.args["a"]}}) + "\\n")
        await asyncio.sleep(0.1)
        run.trace.content = str(run.task.args["a"] + run.task.args["b"])

async def main():
    rows = [{{"env": "adder", "id": "add", "args": {{"a": BASE + i, "b": 1}},
             "source": str(HERE / "env.py")}} for i in range({rows})]
    (HERE / f"ready-{{TAG}}").touch()
    deadline = time.monotonic() + 60
    while not (HERE / f"ready-{{OTHER}}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    job = await Taskset(TAG, rows).run(Agent_{tag}(), runtime=LocalRuntime(str(HERE / "env.py")),
                                       group={group}, max_concurrent=6)
    print("RESULT " + json.dumps({{"pid": os.getpid(), "job": job.id, "runs": [
        {{"a": r.task.args["a"], "status": r.status, "reward": r.reward, "error": r.error}}
        for r in job.runs]}}), flush=True)

asyncio.run(main())
'''


def test_two_scripts_on_one_embedded_server_run_only_their_own_rollouts(embedded_server,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(ENV)
    bases = {"one": 0, "two": 1000}
    procs = {}
    for tag, other in (("one", "two"), ("two", "one")):
        script = tmp_path / f"{tag}.py"
        script.write_text(SCRIPT.format(tag=tag, rows=ROWS, group=GROUP))
        env = cli_env()
        env.pop("ROLLOUTS_TASK_QUEUE", None)  # the default: no queue chosen
        procs[tag] = subprocess.Popen(
            [sys.executable, str(script), tag, other, str(bases[tag]), str(tmp_path)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for tag, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{tag}: exit {proc.returncode}\n{err[-3000:]}"
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        results[tag] = json.loads(line.removeprefix("RESULT "))
    assert results["one"]["job"] != results["two"]["job"]
    for tag, base in bases.items():
        runs = results[tag]["runs"]
        own = sorted(base + i for i in range(ROWS) for _ in range(GROUP))
        assert sorted(r["a"] for r in runs) == own, f"{tag} holds rows that are not its own"
        bad = [r for r in runs if r["status"] != "succeeded" or r["reward"] != 1.0]
        assert not bad, f"{tag}: {bad[:3]}"
        calls = [json.loads(ln) for ln in (tmp_path / f"calls-{tag}.log").read_text().splitlines()]
        assert {c["pid"] for c in calls} == {results[tag]["pid"]}, "an agent ran in the other script"
        assert sorted(c["a"] for c in calls) == own  # each rollout's agent ran once, here
