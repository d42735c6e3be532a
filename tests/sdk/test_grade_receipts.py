"""Grade receipts: a grade step that finds its substrate gone returns the grade it received before.

The crash that needs them (a worker SIGKILLed after teardown, before its workflow task completed)
is in ``tests/temporal/test_survival.py``; here the store and the step on a real env server.
"""

from __future__ import annotations

import multiprocessing
from datetime import datetime, timedelta, timezone

import pytest

from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import SubstrateGoneError
from durable_rollouts.models import Grade, Task
from durable_rollouts.paths import rollouts_home
from durable_rollouts.runtimes import Runtime
from durable_rollouts.step_io import ConnectInput, GradeInput, StartInput, TeardownInput
from durable_rollouts.steps import substrate as steps
from durable_rollouts.stores import grade_receipts

env = Environment(name="receipts", version="0.1.0")
GRADES: list[str] = []


@env.template()
async def counted(expected: str = "x"):
    answer = yield "say x"
    GRADES.append(str(answer))
    yield {"score": 1.0 if answer == expected else 0.0, "content": f"got {answer}"}


async def test_a_grade_replayed_after_teardown_returns_the_first_grade_without_the_env() -> None:
    GRADES.clear()
    async with serving(env) as server:
        endpoint = await Runtime(server.url).acquire(Task(env="receipts", id="counted"), "receipts-k")
        session = await steps.connect(ConnectInput(endpoint=endpoint))
        await steps.start(StartInput(endpoint=endpoint, session=session, task=Task(env="receipts", id="counted")))
        first = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="x"))
        await steps.teardown(TeardownInput(endpoint=endpoint, session=session))
    # the server is gone: the replayed grade step answers from the receipt
    again = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="x"))
    assert again == first and (again.reward, again.content) == (1.0, "got x")
    assert GRADES == ["x"]
    # another session on the same (gone) substrate key was never graded: gone, as before
    other = session.model_copy(update={"session_id": "sess-never-graded"})
    with pytest.raises(SubstrateGoneError):
        await steps.grade(GradeInput(endpoint=endpoint, session=other, answer="x"))


def test_a_receipt_matches_key_and_session_and_the_newest_wins() -> None:
    grade_receipts.keep("rk-1", "s1", Grade(reward=0.25))
    grade_receipts.keep("rk-1", "s1", Grade(reward=0.5))
    grade_receipts.keep("rk-2", "s1", Grade(reward=0.75))
    found = grade_receipts.find("rk-1", "s1")
    assert found is not None and found.reward == 0.5
    assert grade_receipts.find("rk-1", "s2") is None
    assert grade_receipts.find("rk-3", "s1") is None


def test_days_older_than_kept_are_removed_when_a_new_day_begins(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path))  # its own days: other tests keep theirs
    now = datetime.now(timezone.utc)
    days = [now + timedelta(days=d) for d in range(grade_receipts.KEEP_DAYS + 1)]
    grade_receipts.keep("old-k", "s", Grade(reward=1.0), now=days[0])
    for day in days[1:-1]:
        grade_receipts.keep(f"k-{day:%d}", "s", Grade(reward=1.0), now=day)
    assert grade_receipts.find("old-k", "s") is not None  # still within KEEP_DAYS
    grade_receipts.keep("new-k", "s", Grade(reward=1.0), now=days[-1])
    assert grade_receipts.find("old-k", "s") is None
    kept = sorted(p.name for p in (rollouts_home() / "grades").iterdir())
    assert kept == [f"{d:%Y-%m-%d}" for d in days[1:]]


def _write_many(worker: int, count: int) -> None:
    for i in range(count):
        grade_receipts.keep(f"mp-{worker}-{i}", f"s-{i}", Grade(reward=i / count, content="y" * 300))


def test_processes_appending_at_once_lose_no_receipt() -> None:
    workers, count = 4, 300
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_many, args=(w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for w in range(workers):
        for i in range(count):
            found = grade_receipts.find(f"mp-{w}-{i}", f"s-{i}")
            assert found is not None and found.reward == i / count, (w, i)


def test_a_home_that_cannot_be_written_loses_the_receipt_not_the_grade(tmp_path, monkeypatch, caplog) -> None:
    blocked = tmp_path / "home"
    blocked.write_text("a file where the home folder should be")
    monkeypatch.setenv("ROLLOUTS_HOME", str(blocked))
    monkeypatch.setattr(grade_receipts, "_warned", False)
    with caplog.at_level("WARNING", logger=grade_receipts.__name__):
        assert grade_receipts.keep("k", "s", Grade(reward=1.0)) is False
        assert grade_receipts.keep("k2", "s", Grade(reward=1.0)) is False
    assert grade_receipts.find("k", "s") is None
    assert caplog.text.count("grade receipts are not kept") == 1  # one warning, not one per grade
