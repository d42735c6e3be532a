"""The agent: answer with a sample from the policy version the rollout was started with.

Workers rebuild it from its import path (``policy_agent:PolicyAgent``, with this folder on
their ``PYTHONPATH``). Each rollout reads ``run.policy_version`` and ``run.policy_endpoint``
(what the trainer last published with ``job.set_policy``), samples one answer and records the
answer's index and log-probability in the trace, where the trainer finds them. The draw is
seeded by the rollout id and version, so a retried agent step answers the same.
"""

from __future__ import annotations

import functools
import hashlib
import time

import numpy as np
from tabular_policy import TablePolicy, policy_dir

from durable_rollouts import Agent, Run
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Step


@functools.lru_cache(maxsize=8)
def _policy(endpoint: str, version: int) -> TablePolicy:
    return TablePolicy.load(policy_dir(endpoint), version)


class PolicyAgent(Agent):
    """Samples its answer from the trainer's current policy (a file:// endpoint)."""

    async def __call__(self, run: Run) -> None:
        if run.policy_version is None or not run.policy_endpoint:
            raise ConfigError("PolicyAgent needs a job with a policy: start it with policy_version= "
                              "and policy_endpoint=")
        policy = _policy(run.policy_endpoint, run.policy_version)
        seed = hashlib.sha256(f"{run.rollout_id}:{run.policy_version}".encode()).digest()
        index, logprob = policy.sample(run.prompt_text, np.random.default_rng(list(seed[:8])))
        answer = policy.answers[index]
        run.trace.record(Step(source="agent", messages=[{"role": "assistant", "content": answer}],
                              ended_at=time.time(), extra={
                                  "action": index, "logprob": logprob, "policy_version": run.policy_version,
                                  "token_ids": [index],
                                  "logprobs": {"content": [{"token": answer, "logprob": logprob}]}}))
        run.trace.content = answer
        run.trace.stop_reason = "done"
