"""The export formats from a real durable job: ``openai`` field by field, reward semantics in
every format, and the same lines out of ``Job.export`` and of the ``rollouts export`` CLI (a real
subprocess), including both ATIF versions and bad ``--format`` values. The ATIF mapping itself,
validated against Harbor's published schema, is in ``test_atif_exports.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import atif_rules
import pytest
from cli_helpers import rollouts
from temporal_helpers import ENV_FILE
from training_agents import TOOLS, PolicyAgent

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.taskset import Taskset


def echo(expected: str) -> Task:
    return Task(env="counting", id="echo", args={"expected": expected}, source=ENV_FILE)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


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
    assert row["policy_version"] is None  # this job never published a policy


async def test_errored_rollouts_export_reward_null_in_every_format(client, task_queue, tmp_path) -> None:
    """A failed agent: jsonl keeps the grade but reward null; openai and atif (both versions)
    say reward null and status errored too; the ATIF lines record the agent's error as a system
    step and validate against the schema of their version."""
    job = await Taskset("err", [echo("a")]).run(PolicyAgent(fail_expected=["a"]), runtime=LocalRuntime(ENV_FILE),
                                                temporal=client, worker=True, task_queue=task_queue)
    (plain,) = lines(job.export(tmp_path / "a.jsonl"))
    (chat,) = lines(job.export(tmp_path / "b.jsonl", format="openai"))
    assert plain["reward"] is None and plain["grade"]["reward"] == 0.0 and plain["status"] == "errored"
    assert chat["reward"] is None and chat["status"] == "errored"
    assert [m["role"] for m in chat["messages"]] == ["user"]  # no answer: nothing to learn from
    for fmt, version in (("atif", "1.8"), ("atif-1.4", "1.4")):
        (traj,) = lines(job.export(tmp_path / f"{fmt}.jsonl", format=fmt))
        atif_rules.validate(traj, version)
        assert traj["extra"]["reward"] is None and traj["extra"]["grade"]["reward"] == 0.0
        assert traj["extra"]["status"] == "errored" and traj["extra"]["error_phase"] == "agent loop"
        assert any(s["source"] == "system" and "fails on purpose" in s["message"] for s in traj["steps"])
    with pytest.raises(ConfigError, match="unknown export format"):
        job.export(tmp_path / "d.jsonl", format="parquet")
    assert not (tmp_path / "d.jsonl").exists()  # refused before the file was opened


async def test_the_cli_exports_the_same_lines_as_job_export(dev_server, tool_job, tmp_path) -> None:
    """`rollouts export JOB --format openai|atif|atif-1.8|atif-1.4` writes what Job.export
    writes (each ATIF line valid for its version); a bad --format or ATIF version is one error
    line and exit code 2."""
    versions = {"atif": "1.8", "atif-1.8": "1.8", "atif-1.4": "1.4"}
    for fmt in ("jsonl", "openai", *versions):
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
        for traj in theirs if fmt in versions else []:
            atif_rules.validate(traj, versions[fmt])
            assert traj["schema_version"] == f"ATIF-v{versions[fmt]}"
    for bad_format, says in (("csv", "unknown export format 'csv'"),
                             ("atif-1.5", "ATIF versions written are 1.8, 1.4")):
        bad = rollouts("export", tool_job.id, "-o", str(tmp_path / "x"), "--format", bad_format,
                       "--temporal", dev_server.address)
        assert bad.code == 2 and "Traceback" not in bad.err, bad.err
        assert bad.err.strip().startswith("error:") and says in bad.err and len(bad.err.strip().splitlines()) == 1
        assert not (tmp_path / "x").exists()
