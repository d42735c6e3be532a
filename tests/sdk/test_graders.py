"""Graders on real inputs: text matchers, real bash commands, an LLM judge over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from durable_rollouts.envserver import Environment
from durable_rollouts.graders import (
    BashGrader,
    EvaluationResult,
    LLMJudgeGrader,
    SubScore,
    combine,
    combine_all,
    combine_any,
    contains,
    contains_all,
    contains_any,
    exact_match,
    f1_score,
    numeric_match,
)
from durable_rollouts.models import Task
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset


def test_text_graders() -> None:
    assert exact_match("The  Answer!", "answer") == 1.0
    assert exact_match("Answer", "answer", normalize_text=False) == 0.0
    assert contains("I think PARIS.", "paris") == 1.0
    assert contains("I think PARIS.", "paris", case_sensitive=True) == 0.0
    assert contains_any("red or blue", ["green", "blue"]) == 1.0
    assert contains_all("red or blue", ["green", "blue"]) == 0.0
    assert numeric_match("it is roughly 3.14159", 3.14, tolerance=0.01) == 1.0
    assert numeric_match("1,000 apples", 1000) == 1.0
    assert numeric_match("no number", 1) == 0.0
    assert numeric_match("2.5", "2.4", tolerance=0.05) == 0.0
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert f1_score("", "") == 1.0 and f1_score("x", "y") == 0.0


# A private HOME keeps the login shell away from the user's profile (slow or stateful init such
# as pyenv rehash, which a killed command could leave locked).
QUIET = {"HOME": "/nonexistent-home"}


async def test_bash_grader_runs_real_commands(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("done")
    passed = await BashGrader.grade(weight=1.0, command="test -f ok.txt && cat ok.txt", cwd=str(tmp_path), env=QUIET)
    assert passed.value == 1.0 and passed.info["exit_code"] == 0 and passed.info["output"].endswith("done")
    failed = await BashGrader.grade(command="echo nope; exit 4", cwd=str(tmp_path), env=QUIET)
    assert failed.value == 0.0 and failed.info["exit_code"] == 4 and "nope" in failed.info["output"]


async def test_bash_grader_kills_a_command_that_times_out(tmp_path: Path) -> None:
    marker = tmp_path / "late"
    started = time.monotonic()
    result = await BashGrader.grade(command=f"sleep 5; touch {marker}", timeout=0.3, env=QUIET)
    assert result.value == 0.0 and result.info["timed_out"] is True
    assert time.monotonic() - started < 3
    time.sleep(0.2)
    assert not marker.exists()


class _Judge(BaseHTTPRequestHandler):
    """A tiny OpenAI-compatible chat endpoint: MET when the criterion's word is in the answer."""

    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        prompt = body["messages"][0]["content"]
        answer = prompt.split("Answer: ", 1)[1].split("\n", 1)[0]
        criterion = prompt.split("Criterion: ", 1)[1].split("\n", 1)[0]
        word = criterion.split()[-1]
        verdict = "MET" if word in answer else "UNMET"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Judge.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join(5)


async def test_llm_judge_scores_criteria_over_http(judge_url: str) -> None:
    score = await LLMJudgeGrader.grade(
        weight=1.0, answer="Paris is the capital", question="Capital of France?",
        criteria=["mentions Paris", ("mentions capital", 1.0), ("mentions Berlin", 2.0), ("says is", -0.5)],
        base_url=judge_url, api_key="sk-test", model="judge-1",
    )
    # met: Paris (1) + capital (1) + penalty "is" (-0.5); positive total 4 -> 1.5 / 4
    assert score.value == pytest.approx(0.375)
    assert [v["met"] for v in score.info["verdicts"]] == [True, True, False, True]
    assert "api_key" not in score.info["params"]
    assert {s["path"] for s in _Judge.seen} == {"/v1/chat/completions"}
    assert {s["auth"] for s in _Judge.seen} == {"Bearer sk-test"}
    assert {s["body"]["model"] for s in _Judge.seen} == {"judge-1"}


async def test_llm_judge_reads_base_url_and_key_from_the_environment(judge_url: str, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", judge_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    score = await LLMJudgeGrader.grade(answer="blue sky", criteria=["mentions blue"])
    assert score.value == 1.0 and _Judge.seen[0]["auth"] == "Bearer sk-env"


async def test_combine_normalises_positive_weights_and_keeps_penalties() -> None:
    result = await combine(
        SubScore(name="a", value=1.0, weight=3.0),
        SubScore(name="a", value=0.0, weight=1.0),
        SubScore(name="penalty", value=1.0, weight=-0.25),
    )
    assert isinstance(result, EvaluationResult)
    assert result.reward == pytest.approx(0.5)
    assert [s.name for s in result.subscores] == ["a", "a_2", "penalty"]
    assert [s.weight for s in result.subscores] == pytest.approx([0.75, 0.25, -0.25])
    frame = result.to_frame()
    assert frame["score"] == pytest.approx(0.5) and frame["isError"] is False
    assert (await combine_any(SubScore(name="x", value=0.2), SubScore(name="y", value=0.9))).reward == 0.9
    assert (await combine_all(SubScore(name="x", value=0.2), SubScore(name="y", value=0.9))).reward == 0.2


graded_env = Environment(name="graded", version="0.1.0")


@graded_env.template()
async def shell_task(expected: str = "42"):
    answer = yield "Print the answer."
    yield await combine(
        BashGrader.grade(weight=1.0, command=f"test '{answer}' = '{expected}'", name="shell", env=QUIET),
        SubScore(name="exact", value=exact_match(answer, expected), weight=1.0),
    )


async def test_a_combined_grade_flows_through_a_real_env_into_the_run() -> None:
    job = await run_direct(Taskset("g", [Task(env="graded", id="shell_task")]), FixedAgent(answer="42"),
                           LocalRuntime(graded_env))
    grade = job.runs[0].grade
    assert grade.reward == 1.0 and [s.name for s in grade.subscores] == ["shell", "exact"]
