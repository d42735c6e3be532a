"""Every export format, field by field, from a real durable job: ``jsonl`` (our record),
``openai`` (chat fine-tuning lines) and ``atif`` (one ATIF-v1.4 trajectory per line, validated
against a JSON schema written here from the RFC's published field list). The same lines come out
of ``Job.export`` and of the ``rollouts export`` CLI (a real subprocess)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cli_helpers import rollouts
from temporal_helpers import ENV_FILE
from training_agents import TOOLS, PolicyAgent, ToolTraceAgent

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.sdk.providers import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset

_INT = {"type": "integer"}
_STR = {"type": "string"}
_OBJ = {"type": "object"}
ATIF_SCHEMA: dict[str, Any] = {  # ATIF RFC v1.4: root, AgentSchema, StepObject, ToolCall, Observation, Metrics
    "type": "object",
    "required": ["schema_version", "session_id", "agent", "steps"],
    "properties": {
        "schema_version": {"const": "ATIF-v1.4"},
        "session_id": _STR,
        "notes": _STR,
        "extra": _OBJ,
        "agent": {"type": "object", "required": ["name", "version"],
                  "properties": {"name": _STR, "version": _STR, "model_name": _STR, "extra": _OBJ}},
        "final_metrics": {"type": "object", "properties": {
            "total_prompt_tokens": _INT, "total_completion_tokens": _INT, "total_cached_tokens": _INT,
            "total_cost_usd": {"type": "number"}, "total_steps": _INT, "extra": _OBJ}},
        "steps": {"type": "array", "items": {
            "type": "object",
            "required": ["step_id", "source", "message"],
            "properties": {
                "step_id": {"type": "integer", "minimum": 1},
                "timestamp": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"},
                "source": {"enum": ["system", "user", "agent"]},
                "model_name": _STR,
                "message": _STR,
                "reasoning_content": _STR,
                "tool_calls": {"type": "array", "items": {
                    "type": "object", "required": ["tool_call_id", "function_name", "arguments"],
                    "properties": {"tool_call_id": _STR, "function_name": _STR, "arguments": _OBJ}}},
                "observation": {"type": "object", "required": ["results"], "properties": {
                    "results": {"type": "array", "items": {"type": "object", "properties": {
                        "source_call_id": _STR, "content": _STR}}}}},
                "metrics": {"type": "object", "properties": {
                    "prompt_tokens": _INT, "completion_tokens": _INT, "cached_tokens": _INT,
                    "cost_usd": {"type": "number"},
                    "prompt_token_ids": {"type": "array", "items": _INT},
                    "completion_token_ids": {"type": "array", "items": _INT},
                    "logprobs": {"type": "array", "items": {"type": "number"}}, "extra": _OBJ}},
                "extra": _OBJ,
            },
        }},
    },
}


def echo(expected: str) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected}, source=ENV_FILE)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
async def tool_job(client, task_queue):
    """One succeeded rollout with a tool-calling trace."""
    return await Taskset("tools", [echo("a")]).run(ToolTraceAgent(), runtime=LocalRuntime(ENV_FILE),
                                                   temporal=client, worker=True, task_queue=task_queue)


async def test_openai_lines_carry_messages_tool_calls_tools_and_the_reward(tool_job, tmp_path) -> None:
    """openai: system/user/assistant(tool_calls)/tool/assistant messages in trace order, tool
    arguments as a JSON string, the offered tools, plus reward, group id and status."""
    (row,) = lines(tool_job.export(tmp_path / "sft.jsonl", format="openai"))
    run = tool_job.runs[0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    system, user, call, tool, final = row["messages"]
    assert system == {"role": "system", "content": "You are terse."}
    assert user == {"role": "user", "content": "Say 'a'."}
    assert call["tool_calls"] == [{"id": "call_1", "type": "function",
                                   "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}]
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    assert final == {"role": "assistant", "content": "a"}
    assert row["tools"] == TOOLS
    assert (row["reward"], row["status"], row["group_id"], row["rollout_id"]) == (
        1.0, "succeeded", run.group_id, run.rollout_id)
    assert row["dropped"] is False and row["job_id"] == tool_job.id


async def test_atif_trajectories_validate_and_keep_token_ids_and_logprobs(tool_job, tmp_path) -> None:
    """atif: schema_version ATIF-v1.4, session_id = rollout id, agent name/version/model_name,
    steps numbered from 1 with sources, tool calls with parsed arguments, the tool result as the
    calling step's observation, per-step token metrics with logprobs and token ids, final_metrics
    summed; our outcome under extra."""
    (traj,) = lines(tool_job.export(tmp_path / "atif.jsonl", format="atif"))
    jsonschema.validate(traj, ATIF_SCHEMA)
    run = tool_job.runs[0]
    assert traj["schema_version"] == "ATIF-v1.4" and traj["session_id"] == run.rollout_id
    assert traj["agent"] == {"name": "training_agents:ToolTraceAgent", "version": "0.1.0",
                             "model_name": "scripted-model"}
    steps = traj["steps"]
    assert [s["step_id"] for s in steps] == [1, 2, 3, 4]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    assert steps[0]["message"] == "You are terse." and steps[1]["message"] == "Say 'a'."
    call = steps[2]
    assert call["tool_calls"] == [{"tool_call_id": "call_1", "function_name": "add", "arguments": {"a": 1, "b": 2}}]
    assert call["observation"] == {"results": [{"source_call_id": "call_1", "content": "3"}]}
    assert call["metrics"] == {"prompt_tokens": 11, "completion_tokens": 5, "logprobs": [-0.5, -0.25],
                               "completion_token_ids": [5, 6], "prompt_token_ids": [1, 2, 3]}
    assert call["model_name"] == "scripted-model"
    assert steps[3]["message"] == "a" and steps[3]["metrics"] == {"prompt_tokens": 20, "completion_tokens": 2}
    assert traj["final_metrics"] == {"total_prompt_tokens": 31, "total_completion_tokens": 7, "total_steps": 4}
    assert traj["extra"]["reward"] == 1.0 and traj["extra"]["status"] == "succeeded"
    assert traj["extra"]["group_id"] == run.group_id


async def test_errored_rollouts_export_reward_null_in_every_format(client, task_queue, tmp_path) -> None:
    """A failed agent: jsonl keeps the grade but reward null; openai and atif say reward null and
    status errored too; the ATIF line records the agent's error as a system step and validates."""
    job = await Taskset("err", [echo("a")]).run(PolicyAgent(fail_expected=["a"]), runtime=LocalRuntime(ENV_FILE),
                                                temporal=client, worker=True, task_queue=task_queue)
    (plain,) = lines(job.export(tmp_path / "a.jsonl"))
    (chat,) = lines(job.export(tmp_path / "b.jsonl", format="openai"))
    (traj,) = lines(job.export(tmp_path / "c.jsonl", format="atif"))
    assert plain["reward"] is None and plain["grade"]["reward"] == 0.0 and plain["status"] == "errored"
    assert chat["reward"] is None and chat["status"] == "errored"
    assert [m["role"] for m in chat["messages"]] == ["user"]  # no answer: nothing to learn from
    jsonschema.validate(traj, ATIF_SCHEMA)
    assert traj["extra"]["reward"] is None and traj["extra"]["grade"]["reward"] == 0.0
    assert any(s["source"] == "system" and "fails on purpose" in s["message"] for s in traj["steps"])
    with pytest.raises(ConfigError, match="unknown export format"):
        job.export(tmp_path / "d.jsonl", format="parquet")


async def test_the_cli_exports_the_same_lines_as_job_export(dev_server, tool_job, tmp_path) -> None:
    """`rollouts export JOB --format openai|atif` writes what Job.export writes; a bad --format
    is one error line and exit code 2."""
    for fmt in ("jsonl", "openai", "atif"):
        out = tmp_path / f"cli-{fmt}.jsonl"
        result = rollouts("export", tool_job.id, "-o", str(out), "--format", fmt,
                          "--temporal", dev_server.address)
        assert result.code == 0, result.err
        mine = lines(tool_job.export(tmp_path / f"sdk-{fmt}.jsonl", format=fmt))
        theirs = lines(out)
        if fmt == "jsonl":  # the CLI loads the task row from the batch input; the sdk job too
            assert [r["trace"] for r in theirs] == [r["trace"] for r in mine]
            assert [r["reward"] for r in theirs] == [r["reward"] for r in mine]
        else:
            assert theirs == mine
    bad = rollouts("export", tool_job.id, "-o", str(tmp_path / "x"), "--format", "csv",
                   "--temporal", dev_server.address)
    assert bad.code == 2 and bad.err.strip().startswith("error:") and "Traceback" not in bad.err
