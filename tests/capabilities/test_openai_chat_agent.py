"""``OpenAIChatAgent`` end to end: real env servers, real ssh/bwrap and fastmcp, real HTTP.

The model is the only stand-in: a scripted OpenAI-compatible server on loopback (conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scripted_llm import final, tool_call

from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.stores.tracestore import TraceStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SECRET = "sk-h6-test-NEVER-IN-TRACES-8c1f"


def _last_tool_result(body: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")


def _decoded(node: Any) -> str:
    """Every string in a history, with base64 payload data decoded (payloads are base64 JSON)."""
    import base64

    if isinstance(node, dict):
        return " ".join(_decoded(v) for v in node.values())
    if isinstance(node, list):
        return " ".join(_decoded(v) for v in node)
    if isinstance(node, str):
        try:
            return node + " " + base64.b64decode(node, validate=True).decode("utf-8", "replace")
        except ValueError:
            return node
    return str(node)


def _coding() -> Taskset:
    return Taskset.from_file(EXAMPLES / "coding" / "tasks.py")


def _calc(row: int = 0) -> Taskset:
    rows = list(Taskset.from_file(EXAMPLES / "mcp_calc" / "tasks.py"))
    return Taskset("calc", [rows[row]])


def _fix(body: dict[str, Any]) -> dict[str, Any]:
    shown = _last_tool_result(body)
    assert "min(x, lo)" in shown, shown  # the model "read" the buggy file through the shell
    return tool_call("shell", {"command": "sed -i 's/min(x, lo)/min(x, hi)/' mathutils.py"}, "call_2")


async def test_openai_agent_fixes_the_coding_example_end_to_end(
    scripted_llm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("H6_TEST_API_KEY", SECRET)
    llm = await scripted_llm([
        tool_call("shell", {"command": "cat mathutils.py"}),
        _fix,
        final("Fixed clamp: the upper bound now uses hi."),
    ])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url, api_key_env="H6_TEST_API_KEY",
                            temperature=0.0)
    job = await run_direct(_coding(), agent, LocalRuntime(str(EXAMPLES / "coding" / "env.py")))

    run = job.runs[0]
    assert run.status == "succeeded", run.error
    assert run.reward == 1.0
    assert run.trace.content == "Fixed clamp: the upper bound now uses hi."
    assert run.trace.stop_reason == "done"
    tool_steps = [s for s in run.trace.steps if s.source == "tool"]
    assert [s.extra["tool"] for s in tool_steps] == ["shell", "shell"]
    assert "exit code: 0" in tool_steps[1].messages[0]["content"]
    agent_steps = [s for s in run.trace.steps if s.source == "agent"]
    assert len(agent_steps) == 3 and agent_steps[0].extra["usage"]["total_tokens"] == 15
    first = llm.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {SECRET}"
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["shell"]
    assert first["body"]["temperature"] == 0.0
    # The key is read on the worker only: never in the agent's spec, the run export or the trace.
    exported = job.to_jsonl(tmp_path / "runs.jsonl").read_text()
    assert SECRET not in exported + json.dumps(agent.spec().model_dump())
    assert "sed -i" in exported  # the export carries the whole trace, so the check means something
    assert run.trace_ref is not None and SECRET not in TraceStore().get(run.trace_ref).model_dump_json()


async def test_a_wrong_fix_scores_zero(scripted_llm: Any) -> None:
    llm = await scripted_llm([final("I changed nothing.")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url, api_key_env="H6_UNSET_KEY")
    job = await run_direct(_coding(), agent, LocalRuntime(str(EXAMPLES / "coding" / "env.py")))
    assert job.runs[0].status == "succeeded" and job.runs[0].reward == 0.0
    assert "authorization" not in llm.requests[0]["headers"]


async def test_openai_agent_calls_every_mcp_tool_of_the_env(scripted_llm: Any) -> None:
    def multiply(body: dict[str, Any]) -> dict[str, Any]:
        assert _last_tool_result(body) == "42.0"
        return tool_call("multiply", {"a": 42, "b": 3}, "call_2")

    llm = await scripted_llm([tool_call("add", {"a": 17, "b": 25}), multiply, final("126")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url, system_prompt="Be exact.")
    job = await run_direct(_calc(), agent, LocalRuntime(str(EXAMPLES / "mcp_calc" / "env.py")))

    run = job.runs[0]
    assert run.reward == 1.0, run.error
    tools = {t["function"]["name"]: t["function"] for t in llm.requests[0]["body"]["tools"]}
    assert set(tools) == {"add", "subtract", "multiply", "divide"}
    assert tools["divide"]["parameters"]["required"] == ["a", "b"]
    assert llm.requests[0]["body"]["messages"][0] == {"role": "system", "content": "Be exact."}
    assert [s.messages[0]["content"] for s in run.trace.steps if s.source == "tool"] == ["42.0", "126.0"]


async def test_a_second_malformed_tool_call_stops_the_run(scripted_llm: Any) -> None:
    def still_broken(body: dict[str, Any]) -> dict[str, Any]:
        assert "malformed" in body["messages"][-1]["content"]  # the model was told once
        return tool_call("no_such_tool", {}, "call_2")

    llm = await scripted_llm([tool_call("add", "{not json"), still_broken, final("never asked")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url)
    job = await run_direct(_calc(), agent, LocalRuntime(str(EXAMPLES / "mcp_calc" / "env.py")))

    trace = job.runs[0].trace
    assert trace.stop_reason == "malformed_tool_call"
    assert len(llm.requests) == 2
    errors = [s.error for s in trace.steps if s.source == "tool"]
    assert "not valid JSON" in errors[0] and "unknown tool 'no_such_tool'" in errors[1]


async def test_a_repaired_tool_call_lets_the_run_continue(scripted_llm: Any) -> None:
    llm = await scripted_llm([tool_call("add", "{oops"), tool_call("add", {"a": 17, "b": 25}),
                              tool_call("multiply", {"a": 42, "b": 3}), final("126")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url)
    job = await run_direct(_calc(), agent, LocalRuntime(str(EXAMPLES / "mcp_calc" / "env.py")))
    assert job.runs[0].trace.stop_reason == "done" and job.runs[0].reward == 1.0


async def test_the_agent_stops_at_max_steps_and_keeps_logprobs(scripted_llm: Any) -> None:
    llm = await scripted_llm([tool_call("add", {"a": 1, "b": 1}, f"call_{i}") for i in range(5)])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url, max_steps=2, request_logprobs=True)
    job = await run_direct(_calc(), agent, LocalRuntime(str(EXAMPLES / "mcp_calc" / "env.py")))

    trace = job.runs[0].trace
    assert trace.stop_reason == "max_steps" and len(llm.requests) == 2
    assert job.runs[0].reward == 0.0  # graded anyway, with no answer
    assert llm.requests[0]["body"]["logprobs"] is True
    step = next(s for s in trace.steps if s.source == "agent")
    assert step.extra["logprobs"]["content"][0]["token"] == "ok"
    assert step.extra["token_ids"] == [42, 7] and step.extra["prompt_token_ids"] == [1, 2, 3]


async def test_openai_agent_fixes_the_coding_example_on_the_durable_path(
    scripted_llm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Same rollout through Temporal: the key stays out of every workflow history too."""
    import socket
    import uuid

    from durable_rollouts.temporal.batches import shutdown_embedded
    from durable_rollouts.temporal.connection import (
        connect_client,
        ensure_dev_server,
        stop_dev_server,
    )

    monkeypatch.setenv("H6_TEST_API_KEY", SECRET)
    llm = await scripted_llm([tool_call("shell", {"command": "cat mathutils.py"}), _fix, final("fixed")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url, api_key_env="H6_TEST_API_KEY")
    with socket.socket() as probe:  # any free port, never the well-known 7233
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await ensure_dev_server(tmp_path, port=port, ui=False)
    try:
        client = await connect_client(server.address)
        job = await _coding().run(agent, runtime=LocalRuntime(str(EXAMPLES / "coding" / "env.py")),
                                  temporal=client, worker=True, task_queue=f"h6-{uuid.uuid4().hex[:8]}")
        histories = [await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
                     async for wf in client.list_workflows()]
    finally:
        await shutdown_embedded()
        stop_dev_server(tmp_path)
    run = job.runs[0]
    assert run.status == "succeeded" and run.reward == 1.0, run.error
    assert run.trace.content == "fixed" and run.trace.stop_reason == "done"
    texts = [_decoded(h.to_json_dict()) for h in histories]
    assert any("H6_TEST_API_KEY" in t for t in texts)  # the agent config (the variable's NAME) is there
    assert all(SECRET not in t for t in texts)
    assert SECRET not in job.to_jsonl(tmp_path / "runs.jsonl").read_text()


def _path_without_bwrap(bin_dir: Path) -> str:
    """A PATH holding every program of this one except ``bwrap``: a host without bubblewrap."""
    import os
    import shutil

    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = bin_dir / entry.name
            if entry.name != "bwrap" and not target.exists() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    assert shutil.which("bwrap", path=str(bin_dir)) is None
    return str(bin_dir)


async def test_without_bwrap_the_agent_is_refused_until_the_operator_says_isolation_none(
    scripted_llm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a host without bubblewrap the agent's shell call comes back as one line naming
    bubblewrap and ``isolation="none"``, the grader's sandboxed command is refused the same way
    (the run errors with it), and the file is untouched; ROLLOUTS_WORKSPACE_ISOLATION=none lets
    the same script fix the bug unsandboxed."""
    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path / "bin"))
    monkeypatch.delenv("ROLLOUTS_WORKSPACE_ISOLATION", raising=False)

    def refused(body: dict[str, Any]) -> dict[str, Any]:
        shown = _last_tool_result(body)
        assert "exit code: 126" in shown and "bubblewrap" in shown, shown
        assert 'isolation="none"' in shown and "min(x, lo)" not in shown
        return final("I cannot run commands here.")

    llm = await scripted_llm([tool_call("shell", {"command": "cat mathutils.py"}), refused])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url)
    job = await run_direct(_coding(), agent, LocalRuntime(str(EXAMPLES / "coding" / "env.py")))
    run = job.runs[0]
    assert len(llm.requests) == 2  # the refusal reached the model as the tool call's result
    assert run.status != "succeeded" and "bubblewrap" in (run.error or ""), run
    assert 'isolation="none"' in (run.error or "")

    monkeypatch.setenv("ROLLOUTS_WORKSPACE_ISOLATION", "none")
    llm = await scripted_llm([tool_call("shell", {"command": "cat mathutils.py"}), _fix, final("fixed")])
    agent = OpenAIChatAgent(model="scripted", base_url=llm.url)
    job = await run_direct(_coding(), agent, LocalRuntime(str(EXAMPLES / "coding" / "env.py")))
    assert job.runs[0].status == "succeeded" and job.runs[0].reward == 1.0, job.runs[0].error
