"""`rollouts serve` and `rollouts task list|start|grade` as real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT

LETTERS = Path(__file__).resolve().parents[1] / "examples" / "letters" / "env.py"


def _rollouts() -> list[str]:
    script = Path(sys.executable).parent / "rollouts"
    if script.exists():
        return [str(script)]
    found = shutil.which("rollouts")
    return [found] if found else [sys.executable, "-c", "from durable_rollouts.cli import main; main()"]


def run_cli(*args: str, url: str | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUTS_URL"}
    if url is not None:
        env["ROLLOUTS_URL"] = url
    return subprocess.run([*_rollouts(), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [*_rollouts(), "serve", str(LETTERS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 15
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith(SERVE_PORT_ANNOUNCEMENT):
                port = int(line[len(SERVE_PORT_ANNOUNCEMENT):])
            elif not line and proc.poll() is not None:
                break
        assert port is not None, "rollouts serve announced no port"
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_task_start_prints_the_prompt_and_task_grade_prints_the_score(server_url: str) -> None:
    started = run_cli("task", "start", "count_letter", "--args", '{"word": "banana", "letter": "a"}', "--url", server_url)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "How many 'a' in 'banana'? Answer with a number."
    graded = run_cli("task", "grade", "count_letter", "--answer", "3", url=server_url)  # url from ROLLOUTS_URL
    assert graded.returncode == 0, graded.stderr
    assert json.loads(graded.stdout) == {"score": 1.0}


def test_a_wrong_answer_scores_zero_and_dict_grades_pass_through(server_url: str) -> None:
    assert run_cli("task", "start", "reverse_word", "--args", '{"word": "abc"}', "--url", server_url).returncode == 0
    graded = run_cli("task", "grade", "reverse_word", "--answer", "abc", "--url", server_url)
    assert json.loads(graded.stdout) == {"score": 0.0, "info": {"expected": "cba"}}


def test_task_list_shows_every_template(server_url: str) -> None:
    listed = run_cli("task", "list", "--url", server_url)
    assert listed.returncode == 0
    assert [line.split("(")[0] for line in listed.stdout.splitlines()] == ["count_letter", "reverse_word", "vowels"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["task", "start", "count_letter", "--args", "{not json"], "not valid JSON"),
        (["task", "start", "count_letter", "--args", "[1]"], "JSON object"),
        (["task", "start", "no_such_task"], "unknown task"),
        (["task", "start", "count_letter", "--args", '{"colour": "red"}'], "colour"),
        (["task", "grade", "count_letter"], "--answer"),
        (["task", "grade", "count_letter", "--answer", "1"], "no task in progress"),
        (["task", "start", "count_letter", "--url", "http://x:1"], "tcp://"),
        (["frobnicate"], "frobnicate"),
    ],
    ids=["bad-json", "not-object", "unknown-task", "unknown-arg", "missing-answer", "nothing-parked", "bad-url", "unknown-command"],
)
def test_bad_input_exits_2_with_one_readable_line(server_url: str, args: list[str], needle: str) -> None:
    result = run_cli(*args, url=server_url)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_task_commands_without_a_server_url_exit_2() -> None:
    result = run_cli("task", "start", "count_letter", "--source", str(LETTERS))
    assert result.returncode == 2
    assert "ROLLOUTS_URL" in result.stderr and "rollouts serve" in result.stderr


def test_serve_with_a_missing_env_file_exits_2() -> None:
    result = run_cli("serve", "/nonexistent/env.py")
    assert result.returncode == 2 and "not found" in result.stderr and "Traceback" not in result.stderr
