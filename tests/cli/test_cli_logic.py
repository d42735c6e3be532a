"""The CLI's logic without subprocesses: selectors, summaries, spec parsing, rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts.cli.render import export_record, task_summary, trace_text, ui_link
from durable_rollouts.cli.specs import load_agent_spec, parse_json_object, parse_runtime
from durable_rollouts.cli.views import find_run
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Grade, RolloutResult, Step, Task, TaskCall, Trace
from durable_rollouts.sdk.run import Run
from durable_rollouts.temporal.jobs import dedupe_latest
from durable_rollouts.temporal.select import parse_only, selected

LETTERS = Path(__file__).resolve().parents[2] / "examples" / "letters" / "env.py"


def run(
    slug: str, gi: int, status: str = "succeeded", reward: float | None = 1.0, group: str = ""
) -> Run:
    grade = None if reward is None else Grade(reward=reward)
    return Run(
        rollout_id=f"job-j-{slug}-{gi}",
        slug=slug,
        group_id=group or f"g-{slug}",
        group_index=gi,
        status=status,
        grade=grade,
        task=Task(env="e", id=slug.split("-")[0], args={"n": gi}),
    )


def test_only_accepts_repeated_and_comma_separated_selectors() -> None:
    assert parse_only(["failed,errored", "canceled"]) == {"failed", "errored", "cancelled"}
    assert parse_only(None) is None and parse_only([""]) is None
    with pytest.raises(ConfigError, match="--only 'bogus'"):
        parse_only(["bogus"])


def test_default_selection_is_every_unsuccessful_finished_rollout() -> None:
    runs = [
        run("a", 0),
        run("a", 1, "errored", 0.0),
        run("b", 0, "cancelled", None),
        run("b", 1, "running", None),
        run("c", 0, "pending", None),
        run("c", 1, "succeeded", None),
    ]
    assert [r.rollout_id for r in selected(runs, None)] == ["job-j-a-1", "job-j-b-0"]
    assert [r.rollout_id for r in selected(runs, frozenset({"ungraded"}))] == [
        "job-j-b-0",
        "job-j-c-1",
    ]
    assert [r.rollout_id for r in selected(runs, frozenset({"timeout"}))] == []


def test_latest_result_of_a_rollout_id_wins() -> None:
    def result(rid: str, status: str) -> RolloutResult:
        return RolloutResult(rollout_id=rid, slug="s", group_id="g", group_index=0, status=status)  # type: ignore[arg-type]

    kept = dedupe_latest(
        [result("a", "errored"), result("b", "succeeded"), result("a", "succeeded")]
    )
    assert {k: v.status for k, v in kept.items()} == {"a": "succeeded", "b": "succeeded"}


def test_task_summary_flags_groups_whose_rewards_do_not_differ() -> None:
    runs = [
        run("a", 0, reward=1.0),
        run("a", 1, reward=1.0),
        run("b", 0, reward=1.0),
        run("b", 1, reward=0.0),
        run("c", 0, "errored", None),
    ]
    rows = {r["slug"]: r for r in task_summary(runs)}
    assert (
        rows["a"]["zero_spread"] and rows["a"]["spread"] == 0.0 and rows["a"]["mean_reward"] == 1.0
    )
    assert not rows["b"]["zero_spread"] and rows["b"]["spread"] == 0.5
    assert rows["c"] == {
        "slug": "c",
        "runs": 1,
        "graded": 0,
        "mean_reward": None,
        "spread": None,
        "failures": 1,
        "errored": 1,
        "dropped": 0,
        "zero_spread": False,
        "zero_spread_groups": [],
    }


def test_a_rollout_is_found_by_row_number_full_id_or_unique_suffix() -> None:
    runs = [run("alpha", 0), run("alpha", 1), run("beta", 0)]
    assert find_run(runs, "#2") is runs[2] and find_run(runs, "1") is runs[1]
    assert find_run(runs, "job-j-alpha-0") is runs[0] and find_run(runs, "beta-0") is runs[2]
    with pytest.raises(ConfigError, match="matches 2 rollouts"):
        find_run(runs, "alpha")
    with pytest.raises(ConfigError, match="no rollout"):
        find_run(runs, "gamma")


def test_runtime_specs_build_their_providers() -> None:
    from durable_rollouts.runtimes import LocalRuntime, Runtime, SubprocessRuntime

    assert isinstance(parse_runtime("local"), LocalRuntime)
    sub = parse_runtime(f"subprocess:{LETTERS}")
    assert isinstance(sub, SubprocessRuntime) and sub.path == str(LETTERS)
    borrowed = parse_runtime("tcp://127.0.0.1:9000")
    assert isinstance(borrowed, Runtime) and borrowed.url == "tcp://127.0.0.1:9000"
    ssh = parse_runtime("ssh://ann@box.example:2222/work/dir?key=/keys/id&python=python3.11")
    assert (ssh.host, ssh.user, ssh.port, ssh.workdir, ssh.key, ssh.python) == (
        "box.example",
        "ann",
        2222,
        "work/dir",
        "/keys/id",
        "python3.11",
    )
    assert parse_runtime("docker:letters-env").spec().options["image"] == "letters-env"
    for bad, message in [
        ("warp", "unknown runtime"),
        ("docker:", "needs an image"),
        ("ssh://host/dir", "expected ssh://USER@HOST"),
        ("tcp://x", "expected tcp://HOST:PORT"),
        ("ssh://a@b/c?key=k&colour=red", "unknown option"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_runtime(bad)


def test_agent_specs_accept_built_ins_import_paths_and_files(tmp_path: Path) -> None:
    assert load_agent_spec("fixed", {"answer": "3"}).answer == "3"
    (tmp_path / "my_cli_agents.py").write_text(
        "from durable_rollouts.sdk.agents import Agent\n"
        "class Echo(Agent):\n    word: str = 'x'\n    async def __call__(self, run):\n"
        "        run.trace.content = self.word\n"
    )
    agent = load_agent_spec(f"{tmp_path / 'my_cli_agents.py'}:Echo", {"word": "hi"})
    assert agent.spec().path == "my_cli_agents:Echo" and agent.word == "hi"
    with pytest.raises(ConfigError, match="unknown agent"):
        load_agent_spec("nope", {})
    with pytest.raises(ConfigError, match="agent file not found"):
        load_agent_spec("missing.py:Agent", {})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        parse_json_object('"x"', "--agent-config")


def test_trace_and_export_show_steps_answer_and_grade() -> None:
    r = run("count_letter-1234", 0)
    r.trace = Trace(
        trace_id="t",
        content="3",
        steps=[
            Step(
                index=0,
                source="user",
                messages=[{"role": "user", "content": "How many?"}],
                task_call=TaskCall(
                    phase="setup",
                    name="count_letter",
                    arguments={"n": 0},
                    result={"prompt": "How many?"},
                ),
            ),
            Step(
                index=1,
                source="agent",
                messages=[{"role": "assistant", "content": [{"type": "text", "text": "3"}]}],
            ),
        ],
    )
    text = trace_text(r)
    assert "[0] user" in text and 'setup count_letter({"n": 0})' in text and "assistant: 3" in text
    assert "answer: 3" in text and "grade:  1.000" in text
    record = export_record(r)
    assert (
        record["args"] == {"n": 0} and record["reward"] == 1.0 and record["trace"]["content"] == "3"
    )


def test_ui_link_queries_the_job_id() -> None:
    assert ui_link("http://127.0.0.1:8233/", "abc") == (
        "http://127.0.0.1:8233/namespaces/default/workflows?query=RolloutsJobId%3D%22abc%22"
    )
    assert ui_link(None, "abc") is None
