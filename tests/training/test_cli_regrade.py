"""`rollouts regrade` through the real CLI (subprocesses) on a real dev server: a job whose env
file's grader is swapped after the run re-grades to the new rewards without calling the agent,
by job id and from an exported JSONL file; bad input is one error line with exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_helpers import rollouts

from durable_rollouts.models import Task
from durable_rollouts.sdk.taskset import Taskset

HERE = Path(__file__).resolve().parent
PYPATH = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
ENV_V1 = '''from durable_rollouts.envserver import Environment

env = Environment(name="counting", version="1.0.0")


@env.template()
async def echo(expected: str = "x"):
    answer = yield f"Say {expected!r}."
    yield 1.0 if str(answer or "").strip() == expected else 0.0
'''
ENV_V2 = ENV_V1.replace('"1.0.0"', '"2.0.0"').replace(
    "yield 1.0 if str(answer or \"\").strip() == expected else 0.0",
    "yield 0.5 if str(answer or \"\").strip() == expected else 0.0")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_job(dev_server, tmp_path: Path) -> tuple[str, Path, Path]:
    """`rollouts run` of echo a, b, c with an agent that fails on c; returns (job id, env file,
    the agent's call log)."""
    env_file, calls = tmp_path / "env.py", tmp_path / "calls.log"
    env_file.write_text(ENV_V1)
    rows = [Task(env="counting", id="echo", args={"expected": e}, source=str(env_file)) for e in "abc"]
    tasks = Taskset("letters", rows).to_file(tmp_path / "tasks.jsonl")
    config = {"log": str(calls), "fail_expected": ["c"]}
    result = rollouts("run", str(tasks), "--agent", "training_agents:PolicyAgent", "--agent-config",
                      json.dumps(config), "--temporal", dev_server.address, "--worker", "--json",
                      PYTHONPATH=PYPATH, timeout=120)
    assert result.code == 1, result.err  # c errored
    assert len(lines(calls)) == 3
    return result.json()["job_id"], env_file, calls


def test_regrade_after_the_grader_changed_reports_the_new_rewards(dev_server, tmp_path) -> None:
    """The env file's grader is swapped after the run: `regrade JOB --json -o` re-grades a and b
    to 0.5 (2 changed), skips c (no answer), exports the new runs linked to the old ones; the
    agent's log does not grow. `export` then `regrade FILE` prints the new job id first and the
    same change count."""
    job_id, env_file, calls = run_job(dev_server, tmp_path)
    env_file.write_text(ENV_V2)
    out = tmp_path / "regraded.jsonl"
    result = rollouts("regrade", job_id, "--temporal", dev_server.address, "--worker", "--json",
                      "-o", str(out), timeout=120)
    assert result.code == 0, result.err
    summary = result.json()
    assert (summary["regraded"], summary["changed"], summary["unchanged"]) == (2, 2, 0)
    assert (summary["old_reward"], summary["new_reward"]) == (1.0, 0.5)
    (skipped,) = summary["skipped"]
    assert skipped["rollout_id"].endswith("-0") and "no answer to re-grade" in skipped["reason"]
    assert summary["job_id"] != job_id and summary["counts"] == {"succeeded": 2}
    records = [json.loads(line) for line in lines(out)]
    assert [r["reward"] for r in records] == [0.5, 0.5]
    assert {r["trace"]["extra"]["regrade"]["job_id"] for r in records} == {job_id}
    assert len(lines(calls)) == 3

    exported = tmp_path / "runs.jsonl"
    assert rollouts("export", job_id, "-o", str(exported), "--temporal", dev_server.address).code == 0
    again = rollouts("regrade", str(exported), "--temporal", dev_server.address, "--worker",
                     timeout=120)
    assert again.code == 0, again.err
    first, second = again.out.splitlines()[:2]
    assert first not in (job_id, summary["job_id"]) and len(first) == 32
    assert "re-graded 2 rollouts" in second and "2 rewards changed, 0 unchanged" in second
    assert "mean reward 1.000 -> 0.500" in second and "skipped 1 rollout(s):" in again.out
    assert len(lines(calls)) == 3


def test_regrade_bad_input_is_one_error_line_with_exit_2(dev_server, tmp_path) -> None:
    """Unknown job, missing file, a file that is not an export, a missing grader, a grader on a
    docker runtime: each `error: ...` on one line, exit 2, no traceback."""
    job_id, _, _ = run_job(dev_server, tmp_path)
    notes = tmp_path / "notes.jsonl"
    notes.write_text("not json\n")
    cases = [
        (("no-such-job",), "error: no job with id 'no-such-job'"),
        ((str(tmp_path / "missing.jsonl"),), "error: export file not found"),
        ((str(notes),), "line 1 is not a rollout record"),
        ((job_id, "--grader", str(tmp_path / "nope.py")), "error: grader file not found"),
        ((job_id, "--grader", str(HERE / "regrade_env.py"), "--runtime", "docker:img"),
         "error: a grader file is served by a local or subprocess runtime"),
        ((job_id, "--format", "xml", "-o", str(tmp_path / "x")), "error: unknown export format"),
    ]
    for args, message in cases:
        result = rollouts("regrade", *args, "--temporal", dev_server.address, timeout=60)
        assert result.code == 2, (args, result.err)
        assert message in result.err, (args, result.err)
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
