"""The batch policies and the embedded server through the real `rollouts` CLI (subprocesses):
`run --retries/--on-error` (exit 1 when on_error=fail stopped the job, 2 for a bad policy),
`show` naming dropped groups, `resume --on-error`, and `server status` / `server stop`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cli_helpers import rollouts
from temporal_helpers import ENV_FILE

from durable_rollouts.models import Task
from durable_rollouts.processes import pid_alive
from durable_rollouts.sdk.taskset import Taskset

AGENT = "training_agents:PolicyAgent"
HERE = Path(__file__).resolve().parent
# training_agents for the CLI and its in-process worker, plus whatever this process imports from
PYPATH = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)


def tasks_file(tmp_path: Path, *expected: str) -> Path:
    rows = [Task(env="counting", id="echo", args={"expected": e}, source=ENV_FILE) for e in expected]
    return Taskset("cli", rows).to_file(tmp_path / "tasks.jsonl")


def run_cli(dev_server, tmp_path: Path, *extra: str, config: dict | None = None):
    return rollouts("run", str(tasks_file(tmp_path, "a", "b")), "--agent", AGENT,
                    "--agent-config", json.dumps(config or {}), "--runtime", f"local:{ENV_FILE}",
                    "--temporal", dev_server.address, "--worker", "--json", *extra,
                    PYTHONPATH=PYPATH, timeout=120)


def test_run_with_drop_group_reports_the_dropped_group_and_show_lists_it(dev_server, tmp_path) -> None:
    """`run --group 2 --on-error drop-group`: the group with an error is dropped (exit 1, it did
    not all succeed), the JSON summary's reward averages the kept group only, `show` names it."""
    result = run_cli(dev_server, tmp_path, "--group", "2", "--on-error", "drop-group",
                     config={"fail_expected": ["b"], "fail_members": [0]})
    assert result.code == 1, result.err
    summary = result.json()
    assert summary["on_error"] == "drop_group" and summary["reward"] == 1.0
    assert summary["counts"] == {"errored": 1, "succeeded": 3}
    (dropped,) = summary["dropped_groups"]
    assert [r["dropped"] for r in summary["rollouts"]] == [False, False, True, True]
    assert summary["rollouts"][2]["reward"] is None and summary["rollouts"][2]["grade_reward"] == 0.0
    shown = rollouts("show", summary["job_id"], "--temporal", dev_server.address)
    assert shown.code == 0, shown.err
    assert "1 dropped group(s)" in shown.out and dropped in shown.out
    assert "mean reward 1.000 (succeeded rollouts only)" in shown.out and "(dropped)" in shown.out


def test_run_with_retries_recovers_and_exits_zero(dev_server, tmp_path) -> None:
    """`run --retries 1` with an agent that fails each rollout's first run: all succeed, exit 0."""
    result = run_cli(dev_server, tmp_path, "--retries", "1", config={"fail_expected": ["a", "b"], "fail_below": 1})
    assert result.code == 0, result.err
    summary = result.json()
    assert summary["retries"] == 1 and [r["retries"] for r in summary["rollouts"]] == [1, 1]
    assert summary["reward"] == 1.0


def test_run_with_on_error_fail_stops_the_job_and_exits_one(dev_server, tmp_path) -> None:
    """`run --on-error fail --max-concurrent 1`: the first error cancels the rest (exit 1); the
    second task never starts; `resume --on-error keep` then re-runs both and keeps going."""
    result = run_cli(dev_server, tmp_path, "--on-error", "fail", "--max-concurrent", "1",
                     config={"fail_expected": ["a"]})
    assert result.code == 1, result.err
    summary = result.json()
    assert [r["status"] for r in summary["rollouts"]] == ["errored", "cancelled"]
    assert "on_error=fail" in summary["rollouts"][1]["error"]
    shown = rollouts("show", summary["job_id"], "--temporal", dev_server.address)
    assert f"stopped by on_error=fail after {summary['rollouts'][0]['rollout_id']} failed" in shown.out
    resumed = rollouts("resume", summary["job_id"], "--on-error", "keep", "--temporal", dev_server.address,
                       "--worker", "--json", PYTHONPATH=PYPATH, timeout=120)
    assert resumed.code == 1, resumed.err  # "a" still fails, but "b" now runs
    assert [r["status"] for r in resumed.json()["rollouts"]] == ["errored", "succeeded"]
    assert resumed.json()["on_error"] == "keep"  # the batch's latest run carries the override


def test_a_bad_policy_is_one_error_line_and_exit_two(dev_server, tmp_path) -> None:
    """--on-error must be keep/drop-group/fail and --retries 0..20."""
    bad = run_cli(dev_server, tmp_path, "--on-error", "explode")
    assert bad.code == 2 and bad.err.strip().startswith("error:") and "Traceback" not in bad.err
    worse = run_cli(dev_server, tmp_path, "--retries", "-1")
    assert worse.code == 2 and "Traceback" not in worse.err


def test_server_status_and_stop_manage_the_embedded_server(tmp_path) -> None:
    """`server status` exits 1 with no server; once one runs (started in this ROLLOUTS_HOME)
    it prints the gRPC address, pid, database file and Web UI link (--json too); `server stop`
    stops it (the pid is gone) and status exits 1 again."""
    home = tmp_path / "home"
    env = {"ROLLOUTS_HOME": str(home)}
    none = rollouts("server", "status", **env)
    assert none.code == 1 and "no embedded Temporal server" in none.out
    started = rollouts("jobs", "--json", timeout=120, **env)  # any command starts the embedded server
    assert started.code == 0, started.err
    status = rollouts("server", "status", "--json", **env)
    assert status.code == 0, status.err
    info = status.json()
    state = json.loads((home / "temporal.json").read_text())
    assert info["running"] is True and info["pid"] == state["pid"] and pid_alive(info["pid"])
    assert info["address"] == f"127.0.0.1:{state['port']}" and info["db_file"] == str(home / "temporal.db")
    assert info["ui"] == f"http://127.0.0.1:{state['ui_port']}"
    text = rollouts("server", "status", **env)
    assert text.code == 0 and info["address"] in text.out and str(info["pid"]) in text.out
    assert info["ui"] in text.out
    stopped = rollouts("server", "stop", **env)
    assert stopped.code == 0 and f"pid {info['pid']}" in stopped.out
    deadline = time.monotonic() + 10
    while pid_alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(info["pid"])
    assert rollouts("server", "status", **env).code == 1
    again = rollouts("server", "stop", **env)
    assert again.code == 0 and "no embedded Temporal server was running" in again.out
    assert not os.path.exists(home / "temporal.json")
