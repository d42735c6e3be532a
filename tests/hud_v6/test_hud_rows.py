"""HUD v6 task rows: every field ``hud.Taskset.to_file`` writes loads into our ``Task`` and survives
our ``to_file``, so HUD reads the file back; slugs derive exactly as hud derives them."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

hud = pytest.importorskip("hud", reason="needs the hud package (HUD v6): pip install 'durable-rollouts[hud]'")

from hud.eval import RuntimeConfig as HudRuntimeConfig  # noqa: E402
from hud.eval import Task as HudTask  # noqa: E402
from hud.eval import Taskset as HudTaskset  # noqa: E402

from durable_rollouts import Task, Taskset  # noqa: E402
from durable_rollouts.errors import ConfigError  # noqa: E402
from durable_rollouts.models import task_slug  # noqa: E402


def _huds_rows() -> list[Any]:
    verifier = HudTask(env="referee", id="judge", args={"strict": True}, columns={"kind": "verifier"})
    return [
        HudTask(env="letters", id="count_letter", args={"word": "strawberry", "letter": "r"},
                validation=[{"answer": "3", "reward": 1.0}], agent_config={"timeout_seconds": 30, "max_steps": 4},
                columns={"difficulty": "easy", "suite": "letters"},
                runtime_config=HudRuntimeConfig.model_validate({
                    "image": "letters:1", "resources": {"cpu": 2, "memory_mb": 512},
                    "limits": {"startup_timeout_s": 30, "run_timeout_s": 600}}),
                verifier=verifier),
        HudTask(env="letters", id="count_letter", args={"word": "banana"}, slug="banana-custom"),
        HudTask(env="letters", id="vowels"),
    ]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_huds_rows_load_and_our_file_reads_back_in_hud(tmp_path: Path, suffix: str) -> None:
    theirs = HudTaskset("letters", _huds_rows())
    written = theirs.to_file(tmp_path / f"hud{suffix}")
    ours = Taskset.from_file(written)
    assert ours.slugs == [t.slug for t in theirs] == ["count_letter-" + ours.slugs[0].split("-")[-1],
                                                      "banana-custom", "vowels"]
    first = ours[0]
    assert first.columns == {"difficulty": "easy", "suite": "letters"}
    assert first.agent_config == {"timeout_seconds": 30, "max_steps": 4}
    assert first.validation == [{"answer": "3", "reward": 1.0}]
    assert first.runtime_config.image == "letters:1" and first.runtime_config.limits.run_timeout_s == 600
    assert first.verifier.env == "referee" and first.verifier.columns == {"kind": "verifier"}

    back = HudTaskset.from_file(ours.to_file(tmp_path / f"ours{suffix}"))
    assert [t.model_dump() for t in back] == [t.model_dump() for t in theirs]


def test_a_field_we_do_not_know_is_kept_and_written_back(tmp_path: Path) -> None:
    rows = [json.loads(json.dumps(t.model_dump(mode="json", exclude_none=True))) for t in _huds_rows()[1:]]
    rows[0]["review"] = {"by": "ana", "ok": True}  # a field a newer HUD might write
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ours = Taskset.from_file(tmp_path / "rows.jsonl")
    assert ours[0].model_extra == {"review": {"by": "ana", "ok": True}}
    again = [json.loads(line) for line in ours.to_file(tmp_path / "out.jsonl").read_text().splitlines()]
    assert again[0]["review"] == {"by": "ana", "ok": True}
    assert [t.slug for t in HudTaskset.from_file(tmp_path / "out.jsonl")] == ours.slugs


def test_a_near_miss_of_a_known_field_is_a_typo_not_an_extra() -> None:
    with pytest.raises(ConfigError, match="did you mean 'args'"):
        Taskset("t", [{"env": "e", "id": "t", "arg": {"a": 1}}])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(task_id=st.text(min_size=1, max_size=10), args=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4))
def test_slugs_equal_huds_own(task_id: str, args: dict[str, Any]) -> None:
    assert Task(env="e", id=task_id, args=args).slug == HudTask(env="e", id=task_id, args=args).slug


def test_slugs_of_empty_and_non_json_args_equal_huds_own() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    for args in ({}, {"when": when}, {"word": "straße", "n": 3}):
        assert Task(env="e", id="add", args=args).slug == HudTask(env="e", id="add", args=args).slug
    assert Task(env="e", id="add").slug == "add"


def test_a_slug_recorded_by_an_earlier_release_is_kept() -> None:
    """Rows in running batches' histories carry the slug of our old formula (compact JSON): it
    names their Rollout workflows, so decoding must keep it, while a new row gets HUD's."""
    args = {"word": "strawberry"}
    old = "count_letter-" + hashlib.sha1(
        json.dumps(args, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]
    recorded = Task.model_validate({"env": "letters", "id": "count_letter", "args": args, "slug": old})
    assert recorded.slug == old != task_slug("count_letter", args)
    assert Task(env="letters", id="count_letter", args=args).slug == task_slug("count_letter", args)
