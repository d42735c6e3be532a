"""Where a rollout's wall time goes, plain temporalio against durable, read off the histories.

    python benchmarks/bench_timeline.py [--n 256] [--sleep 2] [--concurrency 64] [--repeats 2]
        [--paths plain,plain-sa,durable]

Runs the same batch through the plain-temporalio baselines of ``_plain.py`` (``plain``: one
sleeping activity per child; ``plain-sa``: with the search attributes every Rollout carries) and
through ``Taskset.run`` on one embedded server, then reads every child's history and its
parent's, and prints the p50/p90 of each link of one rollout's chain, from the parent's start
command to the parent's next start command. The event times are the server's, so the columns
say where a rollout waits: on the server starting a child, on the worker's first workflow task,
in the activity, or on the way back to the parent. The activity's own work (open the in-process
environment, run the agent, grade, tear down) is in ``activity run - sleep``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import time
from dataclasses import dataclass
from typing import Any

from _common import LETTERS, letter_tasks, percentile, private_home
from _plain import plain_client, plain_worker, run_plain
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

LINKS = (
    ("start command -> child started", "the server starts the child (transfer task, visibility)"),
    ("child started -> activity started", "the child's first workflow task, eager activity"),
    ("activity run - sleep", "the activity's own work beyond the agent's sleep"),
    ("activity done -> child closed", "the child's last workflow task"),
    ("child closed -> parent knows", "the server records the close in the parent"),
    ("parent knows -> next start", "the parent's workflow task that starts the next child"),
)


@dataclass
class Chain:
    """One child's marks (seconds, server clock)."""

    initiated: float
    started: float
    first_activity: float = 0.0
    activity_done: float = 0.0
    closed: float = 0.0
    parent_knows: float = 0.0


def _ts(event: Any) -> float:
    return float(event.event_time.ToDatetime().timestamp())


@dataclass
class Parent:
    """The parent's own work: its workflow tasks and its start-to-close time."""

    batch: float
    tasks: list[float]  # each workflow task, started -> completed (s)


async def _chains(client: Client, parent_id: str) -> tuple[list[Chain], Parent]:
    """Every child's chain, and the parent's own workflow tasks."""
    history = await client.get_workflow_handle(parent_id).fetch_history()
    by_id: dict[str, Chain] = {}
    tasks, task_started = [], 0.0
    for ev in history.events:
        kind = ev.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            task_started = _ts(ev)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks.append(_ts(ev) - task_started)
        elif kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            wid = ev.start_child_workflow_execution_initiated_event_attributes.workflow_id
            by_id[wid] = Chain(initiated=_ts(ev), started=0.0)
        elif kind == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            wid = ev.child_workflow_execution_completed_event_attributes.workflow_execution.workflow_id
            by_id[wid].parent_knows = _ts(ev)

    async def child(wid: str, chain: Chain) -> None:
        events = (await client.get_workflow_handle(wid).fetch_history()).events
        chain.started = _ts(events[0])
        for ev in events:
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED and not chain.first_activity:
                chain.first_activity = _ts(ev)
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                chain.activity_done = _ts(ev)
            elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                chain.closed = _ts(ev)

    await asyncio.gather(*(child(wid, chain) for wid, chain in by_id.items()))
    return list(by_id.values()), Parent(_ts(history.events[-1]) - _ts(history.events[0]), tasks)


def _links(chains: list[Chain], sleep: float, concurrency: int) -> dict[str, list[float]]:
    knows = sorted(c.parent_knows for c in chains)
    later = sorted(chains, key=lambda c: c.initiated)[concurrency:]  # started when a slot freed
    reaction = []
    for c in later:
        i = bisect.bisect_right(knows, c.initiated + 1e-6)
        if i:
            reaction.append(c.initiated - knows[i - 1])
    return {
        LINKS[0][0]: [c.started - c.initiated for c in chains],
        LINKS[1][0]: [c.first_activity - c.started for c in chains],
        LINKS[2][0]: [c.activity_done - c.first_activity - sleep for c in chains],
        LINKS[3][0]: [c.closed - c.activity_done for c in chains],
        LINKS[4][0]: [c.parent_knows - c.closed for c in chains],
        LINKS[5][0]: reaction,
    }


async def main(args: argparse.Namespace) -> None:
    from durable_rollouts.runtimes import LocalRuntime
    from durable_rollouts.sdk.agents import FixedAgent, SleepAgent
    from durable_rollouts.sdk.taskset import Taskset
    from durable_rollouts.temporal.batches import _client, shutdown_embedded

    runtime = LocalRuntime(LETTERS)
    await Taskset("warm", letter_tasks(2)).run(FixedAgent(answer="2"), runtime=runtime)
    ours, _ = await _client(None)
    client = await plain_client(ours)
    paths = [p for p in args.paths.split(",") if p]
    collected: dict[str, dict[str, list[float]]] = {p: {} for p in paths}
    batches: dict[str, list[float]] = {p: [] for p in paths}
    parent_tasks: dict[str, list[float]] = {p: [] for p in paths}
    async with plain_worker(client):
        await run_plain(client, "warm", 2, 2, 0.0)
        for rep in range(args.repeats):
            for path in paths:
                t0 = time.perf_counter()
                if path == "durable":
                    job = await Taskset(f"t{rep}", letter_tasks(args.n)).run(
                        SleepAgent(seconds=args.sleep, answer="2"), runtime=runtime,
                        max_concurrent=args.concurrency)
                    parent = f"job-{job.id}"
                else:
                    await run_plain(client, f"t{rep}-{path}", args.n, args.concurrency, args.sleep,
                                    attrs=path == "plain-sa")
                    parent = f"plain-t{rep}-{path}"
                chains, own = await _chains(client, parent)
                batches[path].append(own.batch)
                parent_tasks[path].extend(own.tasks)
                for name, values in _links(chains, args.sleep, args.concurrency).items():
                    collected[path].setdefault(name, []).extend(values)
                print(f"    {path:9s} batch {own.batch:5.2f} s (wall {time.perf_counter() - t0:5.2f} s)", flush=True)
    await shutdown_embedded()
    print(f"{args.n} rollouts of a {args.sleep:g} s agent at concurrency {args.concurrency}, "
          f"{args.repeats} repeats; p50 / p90 in ms over every rollout:")
    print(f"  {'link':36s}" + "".join(f"{p:>16s}" for p in paths))
    for name, meaning in LINKS:
        cells = "".join(f"{1000 * statistics.median(collected[p][name]):8.0f} /"
                        f"{1000 * percentile(collected[p][name], 0.9):5.0f}" for p in paths)
        print(f"  {name:36s}{cells}   ({meaning})")
    cells = "".join(f"{1000 * statistics.median(parent_tasks[p]):8.0f} /{1000 * percentile(parent_tasks[p], 0.9):5.0f}"
                    for p in paths)
    print(f"  {'parent workflow task':36s}{cells}   (started -> completed, each)")
    print(f"  {'parent workflow tasks per rollout':36s}"
          + "".join(f"{len(parent_tasks[p]) / (args.n * args.repeats):16.2f}" for p in paths))
    print(f"  {'batch s (median)':36s}" + "".join(f"{statistics.median(batches[p]):16.2f}" for p in paths))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--paths", default="plain,plain-sa,durable")
    with private_home():
        asyncio.run(main(parser.parse_args()))
