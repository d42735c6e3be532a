"""Every Rollout workflow is searchable: RolloutsStatus (running, then final), RolloutsReward
(Double, succeeded rollouts only), RolloutsErrorPhase and a static summary (task, group index,
attempt), queried through the real `temporal` CLI on a real dev server. Visibility is eventually
consistent, so every query is polled with a deadline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

from temporal_helpers import ENV_FILE
from training_agents import PolicyAgent

from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.connection import temporal_cli
from durable_rollouts.workflows import SEARCH_ATTRIBUTES, child_id


def echo(expected: str) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected}, source=ENV_FILE)


def temporal(address: str, *args: str) -> str:
    done = subprocess.run([temporal_cli(), *args, "--address", address], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def poll(fetch: Any, expected: Any, timeout: float = 30.0) -> Any:
    """Call ``fetch`` (in a thread: the in-process worker keeps running) until it returns
    ``expected`` or the deadline passes (visibility lags the histories)."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(fetch)
        if got == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.3)


def listed(address: str, query: str) -> list[str]:
    out = temporal(address, "workflow", "list", "--query", query, "--output", "json")
    rows = json.loads(out) if out.strip() else []
    return sorted(r["execution"]["workflowId"] for r in rows)


def counted(address: str, query: str) -> int:
    out = temporal(address, "workflow", "count", "--query", query)
    return int(out.split(":")[-1].strip())


def test_the_new_search_attributes_are_registered_with_their_types() -> None:
    """RolloutsReward is a Double and RolloutsErrorPhase a Keyword (what the dev server gets)."""
    assert SEARCH_ATTRIBUTES["RolloutsReward"] == "Double"
    assert SEARCH_ATTRIBUTES["RolloutsErrorPhase"] == "Keyword"
    assert SEARCH_ATTRIBUTES["RolloutsStatus"] == "Keyword"


async def test_a_jobs_failures_are_found_with_temporal_workflow_list(dev_server, client, task_queue) -> None:
    """After a batch with one errored rollout (retried once), `temporal workflow list` finds
    exactly its errored Rollout workflows by status and error phase, `count` finds the succeeded
    ones by reward, and each child carries the summary 'task #group attempt n'."""
    ts = Taskset("visible", [echo("a"), echo("b")])
    job = await ts.run(PolicyAgent(fail_expected=["b"], fail_members=[1]), runtime=LocalRuntime(ENV_FILE),
                       group=2, retries=1, temporal=client, worker=True, task_queue=task_queue)
    bad = job.runs[3]
    assert bad.status == "errored" and bad.retries == 1
    failed_ids = sorted([bad.rollout_id, child_id(bad.rollout_id, 1)])
    job_q = f'RolloutsJobId="{job.id}" AND WorkflowType="Rollout"'
    addr = dev_server.address
    got = await poll(lambda: listed(addr, f'{job_q} AND RolloutsStatus="errored"'), failed_ids)
    assert got == failed_ids
    got = await poll(lambda: listed(addr, f'{job_q} AND RolloutsErrorPhase="agent loop"'), failed_ids)
    assert got == failed_ids
    assert await poll(lambda: counted(addr, f"{job_q} AND RolloutsReward >= 1.0"), 3) == 3
    assert await poll(lambda: counted(addr, f'{job_q} AND RolloutsStatus="succeeded"'), 3) == 3
    # errored rollouts never get a reward attribute, though their grade was 0.0
    assert await poll(lambda: counted(addr, f"{job_q} AND RolloutsReward < 1.0"), 0) == 0
    retry = await client.get_workflow_handle(child_id(bad.rollout_id, 1)).describe()
    assert await retry.static_summary() == f"{bad.slug} #1 attempt 2"
    first = await client.get_workflow_handle(job.runs[0].rollout_id).describe()
    assert await first.static_summary() == f"{job.runs[0].slug} #0"


async def test_a_running_rollout_is_listed_as_running(dev_server, client, task_queue) -> None:
    """While the agent works, the Rollout workflow's RolloutsStatus is running."""
    from durable_rollouts.temporal.batches import start_job

    ts = Taskset("slow", [echo("a")])
    handle = await start_job(ts, PolicyAgent(seconds=3.0), runtime=LocalRuntime(ENV_FILE), temporal=client,
                             worker=True, task_queue=task_queue)
    q = f'RolloutsJobId="{handle.job.id}" AND WorkflowType="Rollout" AND RolloutsStatus="running"'
    assert await poll(lambda: counted(dev_server.address, q), 1, timeout=10) == 1
    job = await handle.wait()
    assert job.runs[0].status == "succeeded"
    q_done = f'RolloutsJobId="{job.id}" AND WorkflowType="Rollout" AND RolloutsStatus="succeeded"'
    assert await poll(lambda: counted(dev_server.address, q_done), 1) == 1
