"""The plain-temporalio baseline of ``bench_overhead.py``: temporalio only, nothing of ours.

One parent workflow keeps at most ``concurrency`` children pending; each child runs one activity
that sleeps ``seconds``. Same server, same process, same unsandboxed runner as our worker, so the
difference to the durable path is what our own workflows, activities and steps add per rollout.
``steps=6`` gives each child our Rollout's shape instead (provision/connect/start as local
activities, the sleeping activity, grade/teardown as local activities; all no-ops but the sleep),
which separates what the step count costs inside temporalio from what our step code costs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

QUEUE = "plain-bench"


@dataclass
class PlainBatch:
    n: int
    concurrency: int
    seconds: float
    steps: int = 1


@activity.defn(name="plain_sleep")
async def plain_sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "2"


@activity.defn(name="plain_noop")
async def plain_noop(step: str) -> str:
    return step


@workflow.defn(name="PlainChild")
class PlainChild:
    @workflow.run
    async def run(self, seconds: float, steps: int = 1) -> str:
        local = timedelta(minutes=1)
        if steps > 1:
            for step in ("provision", "connect", "start"):
                await workflow.execute_local_activity(plain_noop, step, start_to_close_timeout=local)
        answer = await workflow.execute_activity(
            plain_sleep, seconds, start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=5) if steps > 1 else None)
        if steps > 1:
            for step in ("grade", "teardown"):
                await workflow.execute_local_activity(plain_noop, step, start_to_close_timeout=local)
        return answer


@workflow.defn(name="PlainParent")
class PlainParent:
    @workflow.run
    async def run(self, batch: PlainBatch) -> int:
        pending: list[asyncio.Future[str]] = []
        done_count, index = 0, 0
        parent = workflow.info().workflow_id
        while index < batch.n or pending:
            while index < batch.n and len(pending) < batch.concurrency:
                pending.append(asyncio.ensure_future(workflow.execute_child_workflow(
                    PlainChild.run, args=[batch.seconds, batch.steps], id=f"{parent}-{index}")))
                index += 1
            done, rest = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending = list(rest)
            done_count += sum(1 for fut in done if fut.result() == "2")
        return done_count


def plain_worker(client: Client) -> Worker:
    return Worker(client, task_queue=QUEUE, workflows=[PlainParent, PlainChild],
                  activities=[plain_sleep, plain_noop], workflow_runner=UnsandboxedWorkflowRunner(),
                  max_concurrent_activities=500)


async def run_plain(client: Client, name: str, n: int, concurrency: int, seconds: float,
                    steps: int = 1) -> int:
    """Run one plain batch to the end; returns how many children answered."""
    return await client.execute_workflow(PlainParent.run, PlainBatch(n, concurrency, seconds, steps),
                                         id=f"plain-{name}", task_queue=QUEUE)
