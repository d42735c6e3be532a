"""Default slugs of large tasksets (issue #39: a taskset of 100,000+ rows of one task id).

A default slug is the task id and 8 hex digits of the args' SHA-1 (as HUD v6 derives it); past
about 77,000 rows of one id two different rows are likely to share those 8 digits. The later row
then gets 16 digits instead of the load failing; the same row twice is still a duplicate.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task, task_slug
from durable_rollouts.sdk.taskset import Taskset


def _colliding_args() -> tuple[dict[str, str], dict[str, str]]:
    """Two different args whose default slugs collide (found by search: a birthday bound)."""
    seen: dict[str, dict[str, str]] = {}
    for i in range(1_000_000):
        args = {"word": f"w{i}"}
        digest = hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
        if digest in seen:
            return seen[digest], args
        seen[digest] = args
    raise AssertionError("no collision found")


def test_a_row_whose_default_slug_collides_gets_a_longer_one() -> None:
    first, second = _colliding_args()
    assert task_slug("count", first) == task_slug("count", second)
    tasks = Taskset("big", [{"env": "e", "id": "count", "args": first},
                            {"env": "e", "id": "count", "args": second}])
    slugs = [t.slug for t in tasks]
    assert slugs[0] == task_slug("count", first)  # the first keeps HUD's slug
    assert slugs[1] == task_slug("count", second, 16) and len(slugs[1]) == len(slugs[0]) + 8
    again = Taskset("big", [{"env": "e", "id": "count", "args": first},
                            {"env": "e", "id": "count", "args": second}])
    assert [t.slug for t in again] == slugs  # the same file gives the same slugs


def test_the_same_row_twice_and_a_carried_slug_twice_are_still_duplicates() -> None:
    row = {"env": "e", "id": "count", "args": {"word": "a"}}
    with pytest.raises(ConfigError, match="duplicate task slug"):
        Taskset("dup", [row, dict(row)])
    with pytest.raises(ConfigError, match="duplicate task slug 'mine'"):
        Taskset("dup", [Task(env="e", id="a", slug="mine"), Task(env="e", id="b", slug="mine")])


@pytest.mark.slow  # 200,000 rows (~3 s)
def test_two_hundred_thousand_rows_of_one_task_id_load() -> None:
    rows = [{"env": "e", "id": "count", "args": {"word": f"w{i}rr", "letter": "r"}} for i in range(200_000)]
    tasks = Taskset("big", rows)
    assert len(tasks) == 200_000 and len({t.slug for t in tasks}) == 200_000
