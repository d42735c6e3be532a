"""The whole life of a batch through the real `rollouts` CLI, as subprocesses, on the embedded
dev server (started once per session) with real workers: run, jobs, show, export, trace,
run --detach, cancel, and resume after rollouts failed on purpose."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cli_helpers import ANSWERS, LETTERS, alive, flaky_config, rollouts, wait_until

AGENT = "flaky_agent:FlakyAgent"


def export_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_attached_summarizes_exports_and_is_listed_shown_and_traced(
    embedded_server, tmp_path
) -> None:
    """`run` exits 0 when every rollout succeeded, links the Web UI, prints a per-task summary and
    writes -o JSONL; `jobs`, `show --json`, `export` and `trace` then present the same job."""
    out = tmp_path / "runs.jsonl"
    result = rollouts(
        "run",
        str(LETTERS),
        "--agent",
        "table",
        "--agent-config",
        json.dumps({"answers": ANSWERS}),
        "--runtime",
        "local",
        "--group",
        "2",
        "--name",
        "letters-attached",
        "-o",
        str(out),
    )
    assert result.code == 0, result.err
    assert (
        f"http://127.0.0.1:{embedded_server.ui_port}/namespaces/default/workflows?query=RolloutsJobId"
        in result.err
    )
    assert (
        "count_letter-" in result.out
        and "mean reward" in result.out
        and "zero spread" in result.out
    )
    assert "8 rollouts: 8 succeeded; mean reward 0.750" in result.out
    runs = export_lines(out)
    job_id = runs[0]["job_id"]
    assert len(runs) == 8 and len({r["rollout_id"] for r in runs}) == 8
    assert all(r["status"] == "succeeded" and r["trace"]["steps"] for r in runs)

    listed = rollouts("jobs", "--json").json()
    assert {"job_id": job_id, "name": "letters-attached", "status": "completed"}.items() <= listed[
        0
    ].items()

    shown = rollouts("show", job_id, "--json").json()
    assert shown["status"] == "completed" and shown["counts"] == {"succeeded": 8}
    assert shown["reward"] == 0.75 and shown["group"] == 2 and shown["runtime"] == "local"
    assert {t["slug"]: t["zero_spread"] for t in shown["tasks"]}  # every group agrees: all flagged
    assert all(t["zero_spread"] for t in shown["tasks"])
    table = rollouts("show", job_id)
    assert table.code == 0 and "zero reward spread" in table.out and job_id in table.out

    exported = tmp_path / "export.jsonl"
    assert rollouts("export", job_id, "-o", str(exported)).code == 0
    again = export_lines(exported)
    key = lambda r: (
        r["rollout_id"],
        r["status"],
        r["reward"],
        r["args"],
        r["group_id"],
        r["attempts"],
    )
    assert sorted(map(key, again)) == sorted(map(key, runs))
    assert {
        "job_id",
        "rollout_id",
        "slug",
        "args",
        "group_id",
        "reward",
        "grade",
        "trace",
        "attempts",
        "status",
        "error",
    } <= set(again[0])

    first = runs[0]["rollout_id"]
    trace = rollouts("trace", job_id, first)
    assert trace.code == 0, trace.err
    assert first in trace.out and "answer: 3" in trace.out and "grade:  1.000" in trace.out
    assert rollouts("trace", job_id, "7").code == 0
    missing = rollouts("trace", job_id, "no-such-rollout")
    assert missing.code == 2 and missing.err.startswith("error: no rollout")


def test_show_of_an_unknown_job_is_a_user_error(embedded_server) -> None:
    result = rollouts("show", "0123456789abcdef")
    assert result.code == 2 and result.err.strip() == (
        "error: no job with id '0123456789abcdef' (list recent jobs with `rollouts jobs`)"
    )


def test_run_exits_1_when_rollouts_fail_and_resume_reruns_only_those(
    embedded_server, tmp_path
) -> None:
    """Rollouts of two tasks fail on purpose: exit 1. After the cause is fixed, `resume` re-runs
    exactly those rollout ids (the agent log proves it), keeps the rest, and exits 0; a second
    resume has nothing to do (exit 0); the export has every rollout exactly once."""
    config = flaky_config(tmp_path, fail_ids=("vowels", "reverse_word"))
    result = rollouts(
        "run", str(LETTERS), "--agent", AGENT, "--agent-config", config, "--group", "2", "--json"
    )
    assert result.code == 1, result.err
    job = result.json()
    failed = {r["rollout_id"] for r in job["rollouts"] if r["status"] != "succeeded"}
    assert len(failed) == 4 and all(
        r["error_phase"] == "agent loop" for r in job["rollouts"] if r["rollout_id"] in failed
    )
    assert job["counts"] == {"errored": 4, "succeeded": 4}

    log = tmp_path / "agent.log"
    log.write_text("")
    (tmp_path / "marker").touch()  # the cause is fixed
    resumed = rollouts("resume", job["job_id"])
    assert resumed.code == 0, resumed.err
    assert "re-running 4 rollout(s), keeping 4" in resumed.err
    assert sorted(log.read_text().split()) == sorted(failed)  # only the failed ones ran again
    assert "8 rollouts: 8 succeeded" in resumed.out

    again = rollouts("resume", job["job_id"])
    assert again.code == 0 and "nothing to resume" in again.err

    out = tmp_path / "final.jsonl"
    assert rollouts("export", job["job_id"], "-o", str(out)).code == 0
    final = export_lines(out)
    assert len(final) == 8 and len({r["rollout_id"] for r in final}) == 8
    assert {r["rollout_id"] for r in final} == {r["rollout_id"] for r in job["rollouts"]}
    assert all(r["status"] == "succeeded" for r in final)
    listed = [j for j in rollouts("jobs", "--json").json() if j["job_id"] == job["job_id"]]
    assert len(listed) == 1 and listed[0]["status"] == "completed"  # found by its job id, once


def test_resume_only_selects_by_status(embedded_server, tmp_path) -> None:
    """--only picks rollouts by what happened to them: errored ones are not `cancelled`."""
    config = flaky_config(tmp_path, fail_ids=("vowels",))
    job = rollouts("run", str(LETTERS), "--agent", AGENT, "--agent-config", config, "--json").json()
    nothing = rollouts("resume", job["job_id"], "--only", "cancelled,timeout")
    assert nothing.code == 0 and "nothing to resume" in nothing.err
    still = rollouts("resume", job["job_id"], "--only", "errored")  # the marker is still missing
    assert still.code == 1 and "re-running 1 rollout(s), keeping 3" in still.err


def test_detached_run_returns_at_once_and_a_background_worker_finishes_it(
    embedded_server, tmp_path, background_workers
) -> None:
    """--detach prints the job id and exits; the background worker runs the job and exits after it."""
    config = flaky_config(tmp_path, seconds=1.0)
    started = time.monotonic()
    result = rollouts(
        "run", str(LETTERS), "--agent", AGENT, "--agent-config", config, "--detach", "--json"
    )
    assert result.code == 0, result.err
    info = result.json()
    assert time.monotonic() - started < 15
    job_id, pid = info["job_id"], info["worker_pid"]
    background_workers.append(pid)

    def status() -> str:
        return rollouts("show", job_id, "--json").json()["status"]

    wait_until(lambda: status() == "completed", timeout=40, what="the detached job")
    shown = rollouts("show", job_id, "--json").json()
    assert shown["counts"] == {"succeeded": 4}

    wait_until(lambda: not alive(pid), timeout=20, what="the background worker to exit")


def test_cancel_stops_a_running_job_and_tears_every_substrate_down(
    embedded_server, tmp_path, background_workers
) -> None:
    """`cancel` on a detached job with slow agents: the job closes cancelled, every started rollout
    ran its teardown (no subprocess substrate left), and `show` lists the cancelled rollouts.
    `resume --only cancelled` then runs the cancelled and the never-started rollouts to the end."""
    config = flaky_config(tmp_path, seconds=60, fast_after_marker=True)
    info = rollouts(
        "run",
        str(LETTERS),
        "--agent",
        AGENT,
        "--agent-config",
        config,
        "--runtime",
        "subprocess",
        "--max-concurrent",
        "2",
        "--detach",
        "--json",
    ).json()
    job_id = info["job_id"]
    background_workers.append(info["worker_pid"])
    log = tmp_path / "agent.log"
    wait_until(
        lambda: log.exists() and len(log.read_text().split()) == 2,
        timeout=40,
        what="two agents running",
    )

    result = rollouts("cancel", job_id)
    assert result.code == 0, result.err
    assert f"cancelled job {job_id}" in result.out and "torn down" in result.out
    home = Path(os.environ["ROLLOUTS_HOME"]) / "substrates"
    assert not [p for p in home.glob(f"job-{job_id}-*")], (
        "a substrate outlived its cancelled rollout"
    )

    shown = rollouts("show", job_id, "--json").json()
    assert shown["status"] == "cancelled" and shown["counts"] == {"cancelled": 4}
    assert rollouts("cancel", job_id).out.startswith(f"job {job_id} is not running")
    gc = rollouts("gc", "--dry-run", "--job", job_id)
    assert gc.code == 0 and gc.out.strip() == "no orphaned substrates", gc.out + gc.err

    (tmp_path / "marker").touch()
    log.write_text("")
    resumed = rollouts("resume", job_id, "--only", "cancelled", "--json")
    assert resumed.code == 0, resumed.err
    assert sorted(log.read_text().split()) == sorted(r["rollout_id"] for r in shown["rollouts"])
    assert resumed.json()["counts"] == {"succeeded": 4} and resumed.json()["status"] == "completed"


def test_server_reports_the_running_embedded_server(embedded_server) -> None:
    result = rollouts("server")
    assert result.code == 0, result.err
    assert (
        f"already running (pid {embedded_server.pid}): gRPC 127.0.0.1:{embedded_server.port}"
        in result.out
    )
    assert f"Web UI http://127.0.0.1:{embedded_server.ui_port}" in result.out
