"""Agents of the training-results tests (worker and CLI subprocesses import them via PYTHONPATH).

``PolicyAgent`` fails on purpose for chosen tasks / group members / retries, so each ``on_error``
policy and ``retries`` can be driven (and logs each call to ``log``, so a test sees it never ran); ``ToolTraceAgent`` records a trace shaped like
``OpenAIChatAgent``'s (system prompt, tool call with usage, logprobs and token ids, tool result,
final answer) for the export-format tests.
"""

from __future__ import annotations

import asyncio
import json
import time

from durable_rollouts.models import Step
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.run import Run

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}]


class PolicyAgent(Agent):
    """Answers each echo task's ``expected``; raises for tasks in ``fail_expected`` (only the
    members in ``fail_members`` when given) while the retry index is below ``fail_below``."""

    fail_expected: list[str] = []
    fail_members: list[int] | None = None
    fail_below: int = 1000
    seconds: float = 0.0
    log: str = ""  # one line per call, when set

    async def __call__(self, run: Run) -> None:
        expected = str((run.task.args if run.task else {}).get("expected", ""))
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"{run.rollout_id}\n")
        failing = (expected in self.fail_expected
                   and (self.fail_members is None or run.group_index in self.fail_members)
                   and run.attempt - 1 < self.fail_below)
        if failing:
            raise RuntimeError(f"{expected} fails on purpose (attempt {run.attempt})")
        await asyncio.sleep(self.seconds)
        run.trace.content = expected


class ToolTraceAgent(Agent):
    """Records one tool-calling turn and a final answer, as OpenAIChatAgent does per turn."""

    async def __call__(self, run: Run) -> None:
        expected = str((run.task.args if run.task else {}).get("expected", ""))
        trace = run.trace
        trace.extra["tools"] = TOOLS
        system = {"role": "system", "content": "You are terse."}
        trace.record(Step(source="system", messages=[system], ended_at=time.time()))
        call = {"id": "call_1", "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}
        trace.record(Step(source="agent", messages=[{"role": "assistant", "content": "", "tool_calls": [call]}],
                          ended_at=time.time(), extra={
                              "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
                              "model": "scripted-model", "finish_reason": "tool_calls",
                              "logprobs": {"content": [{"token": "a", "logprob": -0.5},
                                                       {"token": "b", "logprob": -0.25}]},
                              "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3]}))
        trace.record(Step(source="tool", messages=[{"role": "tool", "tool_call_id": "call_1", "content": "3"}],
                          ended_at=time.time(), extra={"tool": "add", "arguments": {"a": 1, "b": 2}}))
        trace.record(Step(source="agent", messages=[{"role": "assistant", "content": expected}],
                          ended_at=time.time(), extra={
                              "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
                              "model": "scripted-model", "finish_reason": "stop"}))
        trace.content = expected
        trace.stop_reason = "done"
