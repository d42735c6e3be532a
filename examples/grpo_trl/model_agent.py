"""The agent: ask the trainer's model endpoint (``run.policy_endpoint``) for one completion.

It records the prompt and completion token ids and the per-token log-probabilities in the trace,
where the trainer's ``rollout_func`` reads them back for TRL.
"""

from __future__ import annotations

import time

import httpx

from durable_rollouts import Agent, Run
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Step


class ModelAgent(Agent):
    """One sampled completion from the policy the rollout started with."""

    async def __call__(self, run: Run) -> None:
        if not run.policy_endpoint:
            raise ConfigError("ModelAgent needs a job with policy_endpoint= (the trainer's model server)")
        async with httpx.AsyncClient(timeout=60) as client:
            reply = (await client.post(f"{run.policy_endpoint}/generate", json={"prompt": run.prompt_text})).json()
        run.trace.record(Step(source="agent", messages=[{"role": "assistant", "content": reply["text"]}],
                              ended_at=time.time(), extra={
                                  "prompt_token_ids": reply["prompt_ids"], "token_ids": reply["completion_ids"],
                                  "token_logprobs": reply["logprobs"], "policy_version": run.policy_version}))
        run.trace.content = reply["text"]
        run.trace.stop_reason = "done"
