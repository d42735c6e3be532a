"""ATIF exports from real durable jobs, every line validated against the JSON Schema of Harbor's
published models for its version (``atif_schemas/``, checked by ``atif_rules``): ``atif`` and
``atif-1.8`` write ATIF-v1.8, ``atif-1.4`` writes ATIF-v1.4. Token ids, logprobs, tool calls and
their results, tool errors and the policy version are carried. The model of the OpenAIChatAgent
job is the one stand-in: a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import atif_rules
import pytest
from scripted_llm import ScriptedLLM, final, tool_call
from training_agents import TOOLS

from durable_rollouts.errors import ConfigError
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
from durable_rollouts.sdk.taskset import Taskset

CALC = Path(__file__).resolve().parents[2] / "examples" / "mcp_calc"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_atif_is_v1_8_with_tools_token_ids_and_logprobs(tool_job, tmp_path) -> None:
    """``atif`` (= ``atif-1.8``): ATIF-v1.8, session_id the rollout id, trajectory_id the attempt,
    agent with model_name and the offered tools as tool_definitions, steps numbered from 1, the
    tool call with parsed arguments and its result as the calling step's observation, per-step
    metrics with logprobs and token ids, llm_call_count 1 per model reply, totals, our outcome
    under extra."""
    (traj,) = lines(tool_job.export(tmp_path / "atif.jsonl", format="atif"))
    atif_rules.validate(traj, "1.8")
    assert lines(tool_job.export(tmp_path / "pinned.jsonl", format="atif-1.8")) == [traj]
    run = tool_job.runs[0]
    assert traj["schema_version"] == "ATIF-v1.8"
    assert traj["session_id"] == traj["trajectory_id"] == run.rollout_id  # a first attempt
    assert traj["agent"] == {"name": "training_agents:ToolTraceAgent", "version": "0.1.0",
                             "model_name": "scripted-model", "tool_definitions": TOOLS}
    steps = traj["steps"]
    assert [(s["step_id"], s["source"]) for s in steps] == [(1, "system"), (2, "user"), (3, "agent"), (4, "agent")]
    assert steps[0]["message"] == "You are terse." and steps[1]["message"] == "Say 'a'."
    call = steps[2]
    assert call["tool_calls"] == [{"tool_call_id": "call_1", "function_name": "add", "arguments": {"a": 1, "b": 2}}]
    assert call["observation"] == {"results": [{"source_call_id": "call_1", "content": "3"}]}
    assert call["metrics"] == {"prompt_tokens": 11, "completion_tokens": 5, "prompt_token_ids": [1, 2, 3],
                               "completion_token_ids": [5, 6], "logprobs": [-0.5, -0.25]}
    assert call["model_name"] == "scripted-model" and call["llm_call_count"] == 1
    assert call["extra"] == {"finish_reason": "tool_calls"}
    assert steps[3]["message"] == "a" and steps[3]["metrics"] == {"prompt_tokens": 20, "completion_tokens": 2}
    assert traj["final_metrics"] == {"total_prompt_tokens": 31, "total_completion_tokens": 7, "total_steps": 4}
    extra = traj["extra"]
    assert (extra["reward"], extra["status"], extra["group_id"], extra["job_id"]) == (
        1.0, "succeeded", run.group_id, tool_job.id)
    assert extra["grade"]["reward"] == 1.0 and extra["stop_reason"] == "done" and extra["attempt"] == 1
    assert extra["policy_version"] is None and extra["policy_endpoint"] is None


async def test_atif_1_4_keeps_the_v1_4_shape(tool_job, tmp_path) -> None:
    """``atif-1.4``: the same trajectory without the fields 1.5-1.8 added (trajectory_id,
    tool_definitions -> agent.extra, llm_call_count); valid for 1.4 and, being older, for 1.8."""
    (old,) = lines(tool_job.export(tmp_path / "v14.jsonl", format="atif-1.4"))
    (new,) = lines(tool_job.export(tmp_path / "v18.jsonl", format="atif"))
    atif_rules.validate(old, "1.4")
    atif_rules.validate(old, "1.8")
    assert old["schema_version"] == "ATIF-v1.4" and "trajectory_id" not in old
    assert old["agent"]["extra"] == {"tool_definitions": TOOLS} and "tool_definitions" not in old["agent"]
    assert all("llm_call_count" not in s for s in old["steps"])
    assert old["steps"][2]["metrics"] == new["steps"][2]["metrics"]  # token ids and logprobs in both
    assert old["final_metrics"] == new["final_metrics"] and old["extra"] == new["extra"]
    assert not atif_rules.is_valid(new, "1.4")  # the 1.4 schema refuses 1.8 fields


async def test_the_schemas_refuse_what_the_published_models_refuse(tool_job, tmp_path) -> None:
    """The validator is not a rubber stamp: each broken copy of a real line fails."""
    (good,) = lines(tool_job.export(tmp_path / "atif.jsonl", format="atif"))

    def broken(change: Any) -> dict[str, Any]:
        doc = copy.deepcopy(good)
        change(doc)
        return doc

    cases = {
        "metrics on a user step": lambda d: d["steps"][1].update(metrics={"prompt_tokens": 1}),
        "an unknown root field": lambda d: d.update(reward=1.0),
        "logprobs as strings": lambda d: d["steps"][2]["metrics"].update(logprobs=["-0.5"]),
        "token ids as floats": lambda d: d["steps"][2]["metrics"].update(completion_token_ids=[5.5]),
        "a step id gap": lambda d: d["steps"][3].update(step_id=9),
        "a result of another step's call": lambda d: d["steps"][2]["observation"]["results"][0].update(
            source_call_id="call_9"),
        "metrics with llm_call_count 0": lambda d: d["steps"][2].update(llm_call_count=0),
        "no agent version": lambda d: d["agent"].pop("version"),
        "a bad timestamp": lambda d: d["steps"][0].update(timestamp="yesterday"),
    }
    for name, change in cases.items():
        assert not atif_rules.is_valid(broken(change), "1.8"), name


async def test_an_openai_chat_agent_job_exports_valid_atif(client, task_queue, tmp_path) -> None:
    """A real OpenAIChatAgent rollout on the durable path (the MCP calculator env, logprobs on):
    a malformed tool call, the repair prompt, two good calls and the answer. Both ATIF versions
    validate; token ids and logprobs reach every model step's metrics; the tool error is kept
    (1.8: on the observation result, 1.4: on the step)."""
    llm = ScriptedLLM([tool_call("add", "{oops"), tool_call("add", {"a": 17, "b": 25}),
                       tool_call("multiply", {"a": 42, "b": 3}, "call_2"), final("126")])
    await llm.start()
    try:
        agent = OpenAIChatAgent(model="scripted", base_url=llm.url, system_prompt="Be exact.",
                                request_logprobs=True)
        taskset = Taskset("calc", [next(iter(Taskset.from_file(CALC / "tasks.py")))])
        job = await taskset.run(agent, runtime=LocalRuntime(str(CALC / "env.py")),
                                temporal=client, worker=True, task_queue=task_queue)
    finally:
        await llm.stop()
    assert job.runs[0].reward == 1.0, job.runs[0].error
    (new,) = lines(job.export(tmp_path / "v18.jsonl", format="atif"))
    (old,) = lines(job.export(tmp_path / "v14.jsonl", format="atif-1.4"))
    atif_rules.validate(new, "1.8")
    atif_rules.validate(old, "1.4")
    steps = new["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "user", "agent", "agent", "agent"]
    assert steps[0]["message"] == "Be exact." and steps[3]["extra"] == {"repair": True}
    agent_steps = [s for s in steps if s["source"] == "agent"]
    for s in agent_steps:
        assert s["metrics"] == {"prompt_tokens": 10, "completion_tokens": 5, "prompt_token_ids": [1, 2, 3],
                                "completion_token_ids": [42, 7], "logprobs": [-0.1]}
        assert s["model_name"] == "scripted" and s["llm_call_count"] == 1
    bad, add, multiply, answer = agent_steps
    assert bad["tool_calls"][0]["arguments"] == {"raw": "{oops"}
    (result,) = bad["observation"]["results"]
    assert result["source_call_id"] == "call_1" and "not valid JSON" in result["extra"]["error"]
    assert add["observation"]["results"] == [{"source_call_id": "call_1", "content": "42.0"}]
    assert multiply["tool_calls"] == [{"tool_call_id": "call_2", "function_name": "multiply",
                                       "arguments": {"a": 42, "b": 3}}]
    assert multiply["observation"]["results"] == [{"source_call_id": "call_2", "content": "126.0"}]
    assert answer["message"] == "126" and "tool_calls" not in answer
    assert {t["function"]["name"] for t in new["agent"]["tool_definitions"]} == {"add", "subtract", "multiply", "divide"}
    assert new["final_metrics"] == {"total_prompt_tokens": 40, "total_completion_tokens": 20, "total_steps": 7}
    old_bad = next(s for s in old["steps"] if s["source"] == "agent")
    assert "extra" not in old_bad["observation"]["results"][0]
    assert "not valid JSON" in old_bad["extra"]["tool_errors"]["call_1"]


async def test_the_policy_version_is_carried_without_endpoint_credentials(tool_job, tmp_path) -> None:
    """The policy a rollout was sampled with (``Run.policy_version`` / ``policy_endpoint``, set
    here on the finished run as a trainer's ``set_policy`` would have) reaches jsonl, openai and
    both ATIF versions; a token in the endpoint url does not."""
    run = tool_job.runs[0]
    run.policy_version = 3
    run.policy_endpoint = "http://trainer:s3cret@127.0.0.1:8000/v1?api_key=s3cret"
    for fmt in ("jsonl", "openai", "atif", "atif-1.4"):
        path = tool_job.export(tmp_path / f"{fmt}.jsonl", format=fmt)
        assert "s3cret" not in path.read_text(), fmt
        (row,) = lines(path)
        where = row["extra"] if fmt.startswith("atif") else row
        assert (where["policy_version"], where["policy_endpoint"]) == (3, "http://127.0.0.1:8000/v1"), fmt
        if fmt.startswith("atif"):
            atif_rules.validate(row, "1.4" if fmt == "atif-1.4" else "1.8")


async def test_a_re_run_rollout_names_its_attempt_as_the_trajectory_id(tool_job, tmp_path) -> None:
    """session_id stays the stable rollout id; trajectory_id is the Rollout workflow of the
    attempt that made the trace (``<rollout_id>-rN`` for the batch's n-th fresh re-run)."""
    run = tool_job.runs[0]
    run.attempt = 3  # as the second re-run of ``retries=2`` records it
    (traj,) = lines(tool_job.export(tmp_path / "atif.jsonl", format="atif"))
    atif_rules.validate(traj, "1.8")
    assert (traj["session_id"], traj["trajectory_id"]) == (run.rollout_id, f"{run.rollout_id}-r2")
    assert traj["extra"]["attempt"] == 3


async def test_an_unknown_atif_version_is_one_clear_error(tool_job, tmp_path) -> None:
    for bad in ("atif-1.5", "atif-2", "ATIF"):
        with pytest.raises(ConfigError) as caught:
            tool_job.export(tmp_path / "x.jsonl", format=bad)
        assert "\n" not in str(caught.value) and "atif-1.4" in str(caught.value)
        assert not (tmp_path / "x.jsonl").exists()
