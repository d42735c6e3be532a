"""The plain-temporalio baseline of ``bench_overhead.py``: temporalio only, nothing of ours.

One parent workflow keeps at most ``concurrency`` children pending; each child runs one activity
that sleeps ``seconds``. Same server, same process, same unsandboxed runner as our worker, so the
difference to the durable path is what our own workflows, activities and steps add per rollout.
``steps=6`` gives each child our Rollout's shape instead (provision/connect/start as local
activities, the sleeping activity, grade/teardown as local activities; all no-ops but the sleep),
which separates what the step count costs inside temporalio from what our step code costs.
``attrs=True`` does the visibility work that DESIGN.md asks of every Rollout: the child starts
with the job id, task slug and status ``running`` as search attributes and a static summary, and
ends with one upsert of its status and reward (so what the server's visibility store costs is
not counted against our code). ``heartbeat=False`` drops the sleeping activity's heartbeat timeout
(``bench_width.py --plain``: minute-long waits with no beat, the cheapest a plain user can do).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

QUEUE = "plain-bench"
JOB_ID = SearchAttributeKey.for_keyword("RolloutsJobId")
TASK_SLUG = SearchAttributeKey.for_keyword("RolloutsTaskSlug")
STATUS = SearchAttributeKey.for_keyword("RolloutsStatus")
REWARD = SearchAttributeKey.for_float("RolloutsReward")


@dataclass
class PlainBatch:
    n: int
    concurrency: int
    seconds: float
    steps: int = 1
    attrs: bool = False
    heartbeat: bool = True


class Sleeping:
    """How many ``plain_sleep`` activities sleep at once in this process (``bench_width.py``)."""

    waiting = 0
    started = 0
    first = 0.0  # time.monotonic() of the first start since ``started`` was reset


@activity.defn(name="plain_sleep")
async def plain_sleep(seconds: float) -> str:
    if not Sleeping.started:
        Sleeping.first = time.monotonic()
    Sleeping.waiting += 1
    Sleeping.started += 1
    try:
        await asyncio.sleep(seconds)
    finally:
        Sleeping.waiting -= 1
    return "2"


@activity.defn(name="plain_noop")
async def plain_noop(step: str) -> str:
    return step


@workflow.defn(name="PlainChild")
class PlainChild:
    @workflow.run
    async def run(self, seconds: float, steps: int = 1, attrs: bool = False, heartbeat: bool = True) -> str:
        local = timedelta(minutes=1)
        if steps > 1:
            for step in ("provision", "connect", "start"):
                await workflow.execute_local_activity(plain_noop, step, start_to_close_timeout=local)
        answer = await workflow.execute_activity(
            plain_sleep, seconds, start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=5) if steps > 1 and heartbeat else None)
        if steps > 1:
            for step in ("grade", "teardown"):
                await workflow.execute_local_activity(plain_noop, step, start_to_close_timeout=local)
        if attrs:
            workflow.upsert_search_attributes([STATUS.value_set("succeeded"), REWARD.value_set(1.0)])
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
                extra = {} if not batch.attrs else {
                    "static_summary": f"task-{index} #0",
                    "search_attributes": TypedSearchAttributes([
                        SearchAttributePair(JOB_ID, parent), SearchAttributePair(TASK_SLUG, f"task-{index}"),
                        SearchAttributePair(STATUS, "running")])}
                pending.append(asyncio.ensure_future(workflow.execute_child_workflow(
                    PlainChild.run, args=[batch.seconds, batch.steps, batch.attrs, batch.heartbeat], id=f"{parent}-{index}",
                    **extra)))
                index += 1
            done, rest = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending = list(rest)
            done_count += sum(1 for fut in done if fut.result() == "2")
        return done_count


async def plain_client(ours: Client) -> Client:
    """A client with temporalio's default converter on the server ``ours`` talks to (no pydantic,
    no codec, no external storage: what a plain temporalio user has)."""
    return await Client.connect(ours.service_client.config.target_host)


def plain_worker(client: Client, slots: int = 500) -> Worker:
    """The plain worker: ``slots`` activities at once; past 500, as many local activities and a
    workflow cache that holds every child (temporalio's defaults below that)."""
    wide = {} if slots <= 500 else {"max_concurrent_local_activities": slots,
                                    "max_cached_workflows": max(1000, slots + 100)}
    return Worker(client, task_queue=QUEUE, workflows=[PlainParent, PlainChild],
                  activities=[plain_sleep, plain_noop], workflow_runner=UnsandboxedWorkflowRunner(),
                  max_concurrent_activities=slots, **wide)


async def run_plain(client: Client, name: str, n: int, concurrency: int, seconds: float,
                    steps: int = 1, attrs: bool = False, heartbeat: bool = True) -> int:
    """Run one plain batch to the end; returns how many children answered."""
    return await client.execute_workflow(
        PlainParent.run, PlainBatch(n, concurrency, seconds, steps, attrs, heartbeat),
        id=f"plain-{name}", task_queue=QUEUE)
