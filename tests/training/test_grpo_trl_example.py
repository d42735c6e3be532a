"""examples/grpo_trl smoke test: TRL's GRPOTrainer takes its groups from the durable stream.

Skipped unless torch, transformers, trl and datasets are installed (``pip install
torch==2.13.0`` for a CPU build, then ``pip install -e '.[train]'``). Three TRL steps on the
session's dev server: every step gets whole groups from the stream, each is acknowledged after
TRL applied it, and the policy version the trainer publishes reaches the rollouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

for _module in ("torch", "transformers", "trl", "datasets"):
    pytest.importorskip(_module, reason=f"examples/grpo_trl needs {_module}: pip install torch==2.13.0 "
                        "(a CPU build), then pip install -e '.[train]'")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_trl"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trl_trains_on_stream_groups_and_acknowledges_each_after_its_step(dev_server, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--temporal", dev_server.address,
                           "--steps", "3", "--out", str(tmp_path), "--task-queue", f"trl-{tmp_path.name}"],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 3
    assert [s["batch"] for s in summary["steps"]] == ["trl:0-2", "trl:2-4", "trl:4-6"]
    assert summary["cursor"] == summary["delivered"] == 6  # every group acknowledged
    assert summary["policy_version"] == 3  # published after each step
    versions = [v for s in summary["steps"] for v in s["policy_versions"]]
    assert versions[0] == 0 and max(versions) >= 1  # later rollouts sampled the updated model
    assert all(0.0 <= s["mean_reward"] <= 1.0 for s in summary["steps"])
