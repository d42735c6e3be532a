"""The trainer process: stream finished groups, apply GRPO updates, publish each new policy.

``python trainer.py RUN_DIR [--temporal HOST:PORT] [--task-queue Q] [...]``

On its first start it saves policy version 0, starts the job (``Taskset.start``) and records
the job id in ``RUN_DIR/checkpoint.json``. Started again (after a crash, a SIGKILL, a
redeploy) it loads the checkpoint and re-attaches with ``Job.attach`` under the same consumer
name: the job delivers every group it has not acknowledged, and never one it has.

Exactly once *in effect* also needs the trainer's side: the update, the new policy and the
position it covers (``cursor``) are saved together before the ack. A trainer killed after
saving but before its ack gets that batch again and skips it (``skipped`` in the log) instead of
applying it twice. ``RUN_DIR/events.jsonl`` logs every receive, update, skip and ack with the
process id; ``checkpoint.json`` holds every applied step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from policy_agent import PolicyAgent
from tabular_policy import Adam, Sample, TablePolicy, group_advantages, grpo_step

from durable_rollouts import Job, LocalRuntime, Taskset
from durable_rollouts.errors import ConfigError
from durable_rollouts.temporal.connection import connect_client

HERE = Path(__file__).resolve().parent
CONSUMER = "trainer"


class RunDir:
    """The trainer's durable state: checkpoint, policy versions, optimizer state, event log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.policies = root / "policy"
        self.optim = root / "optim"
        self.checkpoint_file = root / "checkpoint.json"
        self.events = root / "events.jsonl"
        for path in (self.policies, self.optim):
            path.mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        return self.policies.resolve().as_uri()

    def log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "pid": os.getpid(), "t": round(time.time(), 3), **fields})
        with self.events.open("a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.checkpoint_file.read_text())
        except FileNotFoundError:
            return None

    def save(self, checkpoint: dict[str, Any], policy: TablePolicy, adam: Adam) -> None:
        """Policy and optimizer first (new files), then the checkpoint that names them (renamed
        into place): a crash at any point leaves the previous checkpoint whole."""
        version = checkpoint["version"]
        policy.save(self.policies, version)
        adam.save(self.optim / f"v{version:06d}.npz")
        tmp = self.checkpoint_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(checkpoint, indent=1))
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.checkpoint_file)


def samples_of(groups: list[list[Any]], sizes: list[int]) -> tuple[list[Sample], list[float]]:
    """GRPO samples of finished groups (advantages within each group's kept members), and the
    rewards they carry."""
    samples: list[Sample] = []
    rewards: list[float] = []
    for runs, size in zip(groups, sizes, strict=True):
        assert len(runs) == size  # drop_sample: the group counts as its kept members only
        group_rewards = [run.reward or 0.0 for run in runs]
        rewards += group_rewards
        for run, advantage in zip(runs, group_advantages(group_rewards), strict=True):
            step = next(s for s in reversed(run.trace.steps) if "action" in s.extra)
            samples.append(Sample(run.prompt_text, int(step.extra["action"]), float(step.extra["logprob"]),
                                  advantage))
    return samples, rewards


async def start_or_attach(args: argparse.Namespace, run_dir: RunDir, client: Any) -> tuple[Any, dict[str, Any]]:
    checkpoint = run_dir.load()
    if checkpoint is not None:
        job = await Job.attach(checkpoint["job_id"], temporal=client, worker=False)
        await job.set_policy(checkpoint["version"], endpoint=run_dir.endpoint)  # in case we died before
        run_dir.log("attached", job=job.id, version=checkpoint["version"], cursor=checkpoint["cursor"])
        return job, checkpoint
    policy, adam = TablePolicy(), Adam(lr=args.lr)
    policy.save(run_dir.policies, 0)
    adam.save(run_dir.optim / "v000000.npz")
    env_file = HERE / "env.py"
    taskset = Taskset("sums", [{"env": "sums", "id": "add", "args": {"seed": i}, "source": str(env_file)}
                               for i in range(args.rows)])
    job = await taskset.start(
        PolicyAgent(), runtime=LocalRuntime(str(env_file)), group=args.group, temporal=client,
        worker=False, task_queue=args.task_queue, max_concurrent=args.max_in_flight * args.group,
        max_in_flight=args.max_in_flight, max_staleness=args.max_staleness, on_error="drop_sample",
        consumers=[CONSUMER], policy_version=0, policy_endpoint=run_dir.endpoint, name="grpo-sums")
    checkpoint = {"job_id": job.id, "version": 0, "cursor": 0, "steps": [], "config": vars(args)}
    run_dir.save(checkpoint, policy, adam)
    run_dir.log("started", job=job.id)
    return job, checkpoint


async def train(args: argparse.Namespace) -> None:
    run_dir = RunDir(Path(args.run_dir))
    client = await connect_client(args.temporal)
    job, checkpoint = await start_or_attach(args, run_dir, client)
    version = checkpoint["version"]
    policy = TablePolicy.load(run_dir.policies, version)
    adam = Adam.load(run_dir.optim / f"v{version:06d}.npz")
    async for batch in job.stream(consumer=CONSUMER, batch_size=args.batch_size):
        run_dir.log("received", batch=batch.id, groups=[r.group_id for r in batch.records])
        fresh = [i for i, rec in enumerate(batch.records) if rec.seq >= checkpoint["cursor"]]
        if not fresh:  # applied before a crash, never acknowledged: do not apply it twice
            run_dir.log("skipped", batch=batch.id)
        else:
            samples, rewards = samples_of([batch.groups[i] for i in fresh], [batch.sizes[i] for i in fresh])
            clipped = grpo_step(policy, adam, samples, clip=args.clip)
            version += 1
            sampled = [run.policy_version for i in fresh for run in batch.groups[i]]
            checkpoint["steps"].append({
                "step": len(checkpoint["steps"]) + 1, "batch": batch.id, "pid": os.getpid(),
                "groups": [batch.records[i].group_id for i in fresh],
                "mean_reward": sum(rewards) / len(rewards), "samples": len(samples),
                "sampled_versions": [min(sampled), max(sampled)], "clipped": clipped})
            checkpoint.update(version=version, cursor=batch.end)
            run_dir.save(checkpoint, policy, adam)
            run_dir.log("applied", step=len(checkpoint["steps"]), batch=batch.id, version=version,
                        mean_reward=round(sum(rewards) / len(rewards), 4))
            await job.set_policy(version, endpoint=run_dir.endpoint)
        await batch.ack()
        run_dir.log("acked", batch=batch.id)
    view = await job.view(CONSUMER, 0, 1)
    run_dir.log("done", delivered=view.delivered, cursor=view.cursor, counts=view.counts)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--temporal", help="Temporal address (default: the embedded dev server)")
    parser.add_argument("--task-queue", default="grpo-sums", help="the queue the example's worker polls")
    parser.add_argument("--rows", type=int, default=96, help="groups in the job (one row each)")
    parser.add_argument("--group", type=int, default=4, help="rollouts per group")
    parser.add_argument("--batch-size", type=int, default=4, help="groups per update")
    parser.add_argument("--max-in-flight", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--clip", type=float, default=0.3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    try:
        asyncio.run(train(parse()))
    except ConfigError as exc:  # bad input or an unreachable server: one line, not a traceback
        sys.exit(f"error: {exc}")
