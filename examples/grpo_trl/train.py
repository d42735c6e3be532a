"""TRL's GRPOTrainer fed by the durable stream: rollouts run on Temporal, TRL does the update.

``python examples/grpo_trl/train.py [--temporal HOST:PORT] [--steps 20] [--out DIR]``
(needs ``pip install torch==2.13.0`` or another CPU build first, then ``pip install -e '.[train]'``)

The trainer builds a tiny Llama from a config (no download) and serves it on a loopback port.
It starts a job on the sums env (``examples/grpo_numpy/env.py``) whose agent, ``ModelAgent``,
asks that port for each completion. ``GRPOTrainer(rollout_func=...)`` gets its groups from
``job.stream()`` instead of generating: for each step it acknowledges the batch of the step
before, whose update TRL has applied, publishes ``trainer.state.global_step`` as the policy
version, and returns the next finished groups (token ids, log-probabilities and the env's
rewards). One in-process worker runs the rollouts on a background event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from datasets import Dataset
from model_agent import ModelAgent
from tiny_model import ModelServer, char_tokenizer, tiny_model
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from durable_rollouts import LocalRuntime, Taskset
from durable_rollouts.temporal.connection import connect_client

ENV_FILE = Path(__file__).resolve().parents[1] / "grpo_numpy" / "env.py"


class BackgroundLoop:
    """An asyncio loop in a thread: the Temporal client, the stream and the in-process worker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: Any, timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class StreamRollouts:
    """TRL's ``rollout_func``: the next finished groups from the job, acked once TRL used them."""

    def __init__(self, loop: BackgroundLoop, job: Any, server: ModelServer, groups_per_step: int) -> None:
        self.loop, self.job, self.server = loop, job, server
        self.stream = job.stream(consumer="trl", batch_size=groups_per_step)
        self.pending: Any = None
        self.log: list[dict[str, Any]] = []

    def publish(self, version: int) -> None:
        """TRL applied the update of the pending batch: new rollouts use it, the batch is done."""
        if self.pending is not None:
            self.loop.run(self.job.set_policy(version, endpoint=self.server.url))
            self.loop.run(self.pending.ack())
            self.pending = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self.publish(trainer.state.global_step)
        batch = self.pending = self.loop.run(anext(self.stream))
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_reward": []}
        eos = trainer.processing_class.eos_token_id
        for runs in batch.groups:
            for run in runs:
                step = next((s for s in reversed(run.trace.steps) if "token_ids" in s.extra), None)
                if step is None:  # the agent failed: an empty completion that scores 0
                    out["prompt_ids"].append(trainer.processing_class(run.prompt_text)["input_ids"])
                    out["completion_ids"].append([eos])
                    out["logprobs"].append([0.0])
                else:
                    out["prompt_ids"].append(step.extra["prompt_token_ids"])
                    out["completion_ids"].append(step.extra["token_ids"] or [eos])
                    out["logprobs"].append(step.extra["token_logprobs"] or [0.0])
                out["env_reward"].append(run.reward or 0.0)
        if len(out["env_reward"]) != len(prompts):
            raise RuntimeError(f"stream batch {batch.id} has {len(out['env_reward'])} rollouts, TRL asked "
                               f"for {len(prompts)}: use on_error='keep' and whole groups")
        versions = sorted({run.policy_version for runs in batch.groups for run in runs})
        self.log.append({"step": trainer.state.global_step + 1, "batch": batch.id, "policy_versions": versions,
                         "mean_reward": sum(out["env_reward"]) / len(out["env_reward"])})
        return out


class StepLock(TrainerCallback):
    """Keep the model server from sampling while the optimizer writes the weights."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.server.lock.acquire()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.server.lock.release()


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float], **_: Any) -> list[float]:
    """The env's grade of each rollout, as the stream delivered it."""
    return env_reward


async def start_job(args: argparse.Namespace, server: ModelServer) -> Any:
    client = await connect_client(args.temporal)
    rows = [{"env": "sums", "id": "add", "args": {"seed": i}, "source": str(ENV_FILE)}
            for i in range(args.steps * args.groups_per_step)]
    return await Taskset("sums", rows).start(
        ModelAgent(), runtime=LocalRuntime(str(ENV_FILE)), group=args.group, temporal=client, worker=True,
        task_queue=args.task_queue, max_in_flight=2 * args.groups_per_step, max_staleness=1, on_error="keep",
        consumers=["trl"], policy_version=0, policy_endpoint=server.url, name="grpo-trl")


def main(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out or tempfile.mkdtemp(prefix="grpo-trl-"))
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer)
    loop = BackgroundLoop()
    with ModelServer(model, tokenizer) as server:
        job = loop.run(start_job(args, server))
        rollouts = StreamRollouts(loop, job, server, args.groups_per_step)
        config = GRPOConfig(
            output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.group * args.groups_per_step,
            num_generations=args.group, max_completion_length=1, learning_rate=args.lr, beta=0.0,
            lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
            seed=0)
        prompts = Dataset.from_dict({"prompt": ["(from the stream)"] * (args.steps * args.groups_per_step)})
        trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, train_dataset=prompts,
                              processing_class=tokenizer, rollout_func=rollouts, callbacks=[StepLock(server)])
        trainer.train()
        rollouts.publish(trainer.state.global_step)
        view = loop.run(job.view("trl", 0, 1))
    summary = {"job_id": job.id, "steps": rollouts.log, "global_step": trainer.state.global_step,
               "cursor": view.cursor, "delivered": view.delivered,
               "policy_version": view.policy.version if view.policy else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for entry in rollouts.log:
        print(f"step {entry['step']:3d}  {entry['batch']:>14}  sampled with {entry['policy_versions']}  "
              f"mean reward {entry['mean_reward']:.2f}")
    print(f"job {job.id}: {view.cursor}/{view.delivered} groups acknowledged, policy version "
          f"{summary['policy_version']}; summary in {out / 'summary.json'}")
    loop.run(job.wait())
    return summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temporal", help="Temporal address (default: the embedded dev server)")
    parser.add_argument("--task-queue", default="grpo-trl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", help="where TRL and the summary write (default: a temporary directory)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse())
