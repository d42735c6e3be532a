"""Durable agent turns: what a crash wastes with and without checkpoints, and what they cost.

    python benchmarks/bench_checkpoints.py [--turns 20] [--kills 5,10,15] [--n 3]

Real parts: its own dev server, worker *processes* (SIGKILLed), the env in a subprocess with a
bwrap/asyncssh workspace (``tests/agents/steps_env.py``: ``--turns`` shell commands), the built-in
``OpenAIChatAgent``; the model is the scripted ``tests/agents/agent_helpers.StepsModel`` (its
replies report ``prompt_tokens`` = conversation JSON length / 4, ``completion_tokens`` = 20).

1. Waste per crash: for each kill point K in ``--kills`` the worker is SIGKILLed while model
   request K is in flight and a second worker finishes; model requests and tokens beyond a clean
   run's, and the reward, for ``checkpoints="step"`` (default) and ``"off"`` (starts over).
2. Cost: ``--n`` clean rollouts per mode (``step``, ``turn``, ``off``), one after another on one
   worker: wall time per rollout and history events of its ``Rollout`` workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import with_test_helpers

with_test_helpers("agents", "temporal")
ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
os.environ["ROLLOUTS_HOME"] = tempfile.mkdtemp(prefix="rollouts-bench-cp-")
os.environ.setdefault("ROLLOUTS_LOG_LEVEL", "WARNING")


async def one(client, queue: str, llm, turns: int, mode: str, workers: "Workers",
              kill_at: int | None):
    """One rollout; with ``kill_at`` its worker is SIGKILLed while that request is held."""
    from agent_helpers import STEPS_ENV

    from durable_rollouts.models import Task
    from durable_rollouts.runtimes import SubprocessRuntime
    from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import start_job

    agent = OpenAIChatAgent(model="m", base_url=llm.url, max_steps=turns + 2, checkpoints=mode)
    task = Task(env="steps", id="steps", source=STEPS_ENV, args={"n": turns})
    t0 = time.perf_counter()
    handle = await start_job(Taskset("bench", [task]), agent, runtime=SubprocessRuntime(STEPS_ENV),
                             temporal=client, worker=False, task_queue=queue)
    if kill_at is not None:
        await asyncio.wait_for(llm.held.wait(), 120)
        await workers.replace()
    job = await asyncio.wait_for(handle.wait(), 300)
    seconds = time.perf_counter() - t0
    (run,) = job.runs
    history = await client.get_workflow_handle(run.rollout_id).fetch_history()
    return run, seconds, len(history.events)


class Workers:
    """One live worker process on ``queue``; ``replace`` SIGKILLs it and starts another."""

    def __init__(self, address: str, queue: str) -> None:
        self.address, self.queue, self.current = address, queue, None

    async def start(self) -> None:
        from temporal_helpers import WorkerProcess

        path = os.pathsep.join([str(AGENTS), str(ROOT / "tests" / "temporal"),
                                os.environ.get("PYTHONPATH", "")])
        self.current = await asyncio.to_thread(WorkerProcess, self.address, self.queue,
                                               {"PYTHONPATH": path})

    async def replace(self) -> None:
        self.current.kill()
        await self.start()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()


async def main(turns: int, kills: list[int], n: int) -> None:
    from agent_helpers import StepsModel
    from temporal_helpers import DevServer

    from durable_rollouts.temporal.connection import connect_client

    server = DevServer(Path(os.environ["ROLLOUTS_HOME"]) / "temporal.db")
    server.start()
    workers = Workers(server.address, "bench-checkpoints")
    try:
        client = await connect_client(server.address)
        queue = workers.queue
        await workers.start()
        clean = await StepsModel(n=turns).start()
        await one(client, queue, clean, turns, "step", workers, None)
        base_requests, base_tokens = len(clean.requests), sum(clean.usage())
        await clean.stop()
        print(f"clean {turns}-turn rollout: {base_requests} model requests, {base_tokens} tokens\n")
        print(f"{'mode':<6}{'kill@':>6}{'requests':>10}{'wasted':>8}{'tokens wasted':>15}{'reward':>8}")
        for mode in ("step", "off"):
            for k in kills:
                llm = await StepsModel(n=turns, hold={k}).start()
                run, _, _ = await one(client, queue, llm, turns, mode, workers, k)
                wasted = len(llm.requests) - base_requests
                print(f"{mode:<6}{k:>6}{len(llm.requests):>10}{wasted:>8}"
                      f"{sum(llm.usage()) - base_tokens:>15}{run.reward!s:>8}")
                await llm.stop()
        print(f"\n{'mode':<6}{'rollouts':>9}{'s/rollout':>11}{'history events':>16}{'checkpoints':>13}")
        for mode in ("step", "turn", "off"):
            times, events = [], []
            for _ in range(n):
                llm = await StepsModel(n=turns).start()
                run, seconds, count = await one(client, queue, llm, turns, mode, workers, None)
                assert run.reward == 1.0, run.error
                times.append(seconds)
                events.append(count)
                await llm.stop()
            cps = {"step": 2 * turns, "turn": turns, "off": 0}[mode]
            print(f"{mode:<6}{n:>9}{statistics.median(times):>11.2f}{statistics.median(events):>16.0f}"
                  f"{cps:>13}")
    finally:
        workers.stop()
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--kills", default="5,10,15", help="model request numbers to kill during")
    parser.add_argument("--n", type=int, default=3, help="clean rollouts per mode (cost part)")
    args = parser.parse_args()
    asyncio.run(main(args.turns, [int(k) for k in args.kills.split(",")], args.n))
