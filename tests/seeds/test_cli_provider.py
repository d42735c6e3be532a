"""``rollouts run --runtime MODULE:ATTR``: any provider callable, imported by path (seed 001)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import rollouts

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def test_rollouts_run_takes_a_provider_callable_by_module_attr(tmp_path: Path) -> None:
    events = tmp_path / "events"
    result = rollouts("run", "envs/group_state.py", "--agent", "fixed", "--agent-config",
                      json.dumps({"answer": "x"}), "--runtime", "seed_providers:serve_group_state",
                      "--group", "2", "--json", cwd=HERE, timeout=120, SEED_EVENTS_FILE=str(events))
    assert result.code == 0, result.err[-3000:]
    job = result.json()
    assert job["reward"] == 1.0, job
    assert sorted(line.split(" ", 1)[1] for line in events.read_text().splitlines()) == \
        ["enter probe"] * 2 + ["exit probe"] * 2


def test_an_unimportable_runtime_path_is_one_line_and_exit_2() -> None:
    result = rollouts("run", "envs/group_state.py", "--agent", "fixed", "--runtime",
                      "no_such_module:provider", cwd=HERE)
    assert result.code == 2
    assert "--runtime no_such_module:provider: cannot import it" in result.err
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1
