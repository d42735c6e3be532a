"""Taskset files, slugs and filters; Job aggregates; the trace store."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from durable_rollouts import Job, Task, Taskset
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Grade, RolloutResult, Trace, task_slug
from durable_rollouts.sdk.run import Run
from durable_rollouts.stores.tracestore import TraceStore

LETTERS = Path(__file__).resolve().parents[2] / "examples" / "letters" / "env.py"


def test_duplicate_slugs_are_rejected() -> None:
    with pytest.raises(ConfigError, match="duplicate task slug"):
        Taskset("dup", [Task(env="e", id="t", args={"a": 1}), Task(env="e", id="t", args={"a": 1})])


def test_py_file_scan_finds_the_letters_tasks() -> None:
    ts = Taskset.from_file(LETTERS)
    assert len(ts) == 4 and {t.env for t in ts} == {"letters"}
    assert all(t.source == str(LETTERS) for t in ts)


def test_py_file_with_one_taskset_keeps_its_class_and_name(tmp_path: Path) -> None:
    (tmp_path / "rows.py").write_text(textwrap.dedent("""
        from durable_rollouts import Task, Taskset

        class Lazy(Taskset):
            def resolve_task(self, task):
                return task

        mine = Lazy("my-set", [Task(env="e", id="a"), Task(env="e", id="b")])
    """))
    ts = Taskset.from_file(tmp_path / "rows.py")
    assert type(ts).__name__ == "Lazy" and ts.name == "my-set" and len(ts) == 2


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_json_round_trip_keeps_rows_and_slugs(tmp_path: Path, suffix: str) -> None:
    ts = Taskset.from_file(LETTERS)
    path = ts.to_file(tmp_path / f"rows{suffix}")
    back = Taskset.from_file(path)
    assert back.slugs == ts.slugs and back.tasks == ts.tasks


def test_json_list_and_bad_files(tmp_path: Path) -> None:
    (tmp_path / "l.json").write_text(json.dumps([{"env": "e", "id": "t", "slug": "mine"}, {"env": "e", "id": "t"},
                                                 {"env": "e", "id": "t", "args": {"a": 1}}]))
    assert Taskset.from_file(tmp_path / "l.json").slugs == ["mine", "t", task_slug("t", {"a": 1})]  # a given slug is kept
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match="invalid JSON"):
        Taskset.from_file(tmp_path / "bad.jsonl")
    (tmp_path / "bad.json").write_text(json.dumps([{"env": "e"}]))
    with pytest.raises(ConfigError, match="invalid task row"):
        Taskset.from_file(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="not found"):
        Taskset.from_file(tmp_path / "missing.json")


def test_filter_selects_by_id_env_slug_and_predicate() -> None:
    ts = Taskset.from_file(LETTERS)
    assert len(ts.filter(ids=["count_letter"])) == 2
    assert len(ts.filter(env="other")) == 0
    assert ts.filter(slugs=[ts.slugs[2]]).slugs == [ts.slugs[2]]
    assert len(ts.filter(lambda t: t.args.get("word") == "banana")) == 1


def _run(group: str, reward: float | None, slug: str = "s") -> Run:
    grade = Grade.error("boom") if reward is None else Grade(reward=reward)
    return Run(slug=slug, group_id=group, grade=grade, status="succeeded" if reward is not None else "errored")


def test_job_reward_errors_and_group_spread() -> None:
    job = Job(name="j", runs=[_run("g1", 1.0), _run("g1", 0.0), _run("g2", 1.0), _run("g2", 1.0), _run("g2", None)])
    assert job.reward == pytest.approx(0.75)
    assert len(job.errors) == 1
    stats = job.group_stats()
    assert stats["g1"].mean == 0.5 and stats["g1"].std == 0.5 and not stats["g1"].zero_spread
    assert stats["g2"].graded == 2 and stats["g2"].zero_spread
    assert job.zero_spread_groups == ["g2"]
    assert Job(name="empty").reward is None


def test_job_from_results_loads_traces_from_the_store(tmp_path: Path) -> None:
    import durable_rollouts.temporal.storage  # noqa: F401  # registers the store (as any worker does)

    store = TraceStore(tmp_path / "traces")
    ref = store.put(Trace(trace_id="r1", content="3"))
    assert ref.uri.startswith("rollouts-storage:") and ref.size > 0  # through ROLLOUTS_STORAGE
    results = [
        RolloutResult(rollout_id="r1", slug="s", group_id="g", group_index=0, status="succeeded",
                      reward=1.0, grade=Grade(reward=1.0), trace_ref=ref),
        RolloutResult(rollout_id="r2", slug="s", group_id="g", group_index=1, status="failed",
                      error="[provisioning] no", error_phase="provisioning"),
    ]
    job = Job.from_results("jid", "name", results, store)
    assert job.id == "jid" and job.reward == 1.0 and job.runs[0].trace.content == "3"
    assert job.runs[1].status == "failed" and job.errors == [job.runs[1]]
    out = job.to_jsonl(tmp_path / "runs.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["trace"]["content"] == "3" and rows[1]["error_phase"] == "provisioning"


def test_trace_store_writes_atomically_and_replaces(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_STORAGE", f"file://{tmp_path}/storage")
    store = TraceStore(tmp_path)
    first = store.put(Trace(trace_id="same", content="first"))
    ref = store.put(Trace(trace_id="same", content="second"))
    assert store.get(ref).content == "second" and store.get(ref.uri).content == "second"
    assert store.get(first).content == "first"  # content-addressed: an older ref still reads
    files = [p for p in (tmp_path / "storage").rglob("*") if p.is_file()]
    assert len(files) == 2 and not [p for p in files if p.name.startswith(".tmp-")]


async def test_job_start_opens_an_empty_job() -> None:
    job = await Job.start("grpo", group=8)
    assert job.runs == [] and job.group == 8 and job.id
