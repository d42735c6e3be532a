"""``rollouts run --epochs N --seed S`` (issue #39 item 2): every row N times in one batch."""

from __future__ import annotations

import json

from cli_helpers import ANSWERS, LETTERS, rollouts


def test_run_with_two_epochs_runs_every_row_twice(embedded_server) -> None:
    result = rollouts("run", str(LETTERS), "--agent", "table", "--agent-config",
                      json.dumps({"answers": ANSWERS}), "--epochs", "2", "--seed", "3", "--json",
                      timeout=180)
    assert result.code in (0, 1), result.err  # the letters' vowels task gets no answer (reward 0)
    data = result.json()
    rollouts_ = data["rollouts"]
    first = [r["slug"] for r in rollouts_ if not r["slug"].endswith("-e1")]
    second = [r["slug"] for r in rollouts_ if r["slug"].endswith("-e1")]
    assert first and sorted(f"{s}-e1" for s in first) == sorted(second)
    assert {r["status"] for r in rollouts_} == {"succeeded"}
    assert "x 2 epochs" in result.err
