"""Every committed golden history replays against the current workflows (upgrade safety).

``tests/golden/<version>-<commit>/`` holds histories recorded by ``record.py`` from that release
(``manifest.json`` names each file's workflow type and id). A batch that is running, or waiting
for ``rollouts resume``, when a new release is deployed is continued by the new workers, which
replay its history first: any change to the commands a workflow emits must be behind
``workflow.patched``. A failure here names the file and the release that recorded it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from durable_rollouts.temporal.codec import data_converter
from durable_rollouts.workflows import Rollout, TasksetRun

GOLDEN = Path(__file__).resolve().parent


def golden_files() -> list[tuple[Path, str, str]]:
    """(file, workflow type, workflow id) of every history of every release folder."""
    out = []
    for manifest in sorted(GOLDEN.glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        for scenario in data["scenarios"].values():
            for f in scenario["files"]:
                out.append((manifest.parent / f["file"], f["type"], f["workflow_id"]))
    return out


FILES = golden_files()


def release_folders() -> list[Path]:
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def test_every_release_folder_has_a_manifest_naming_its_release_and_files() -> None:
    """Each folder under tests/golden/ names its release and lists every history it holds."""
    folders = release_folders()
    assert folders, "no golden histories committed"
    for folder in folders:
        data = json.loads((folder / "manifest.json").read_text())
        release = data["release"]
        assert folder.name == f"{release['version']}-{release['commit'][:7]}", folder
        listed = {folder / f["file"] for s in data["scenarios"].values() for f in s["files"]}
        assert listed == set(folder.glob("*/*.json")), f"{folder}: files not in manifest.json"
        assert {"TasksetRun", "Rollout"} <= {f["type"] for s in data["scenarios"].values()
                                             for f in s["files"]}


@pytest.fixture(scope="module")
def replayer() -> Replayer:
    # The sandbox as a worker with ROLLOUTS_WORKFLOW_SANDBOX=1 runs it: our package passed
    # through (each run re-imports nothing of ours), so replays also prove sandbox-compatibility.
    runner = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("durable_rollouts"))
    return Replayer(workflows=[TasksetRun, Rollout], data_converter=data_converter(),
                    workflow_runner=runner)


@pytest.mark.parametrize(("path", "kind", "wid"), FILES,
                         ids=[str(p.relative_to(GOLDEN)) for p, _, _ in FILES])
async def test_golden_history_replays_without_nondeterminism(replayer: Replayer, path: Path,
                                                             kind: str, wid: str) -> None:
    """A history recorded by an earlier release replays on the current workflow code."""
    history = WorkflowHistory.from_json(wid, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is not None:
        pytest.fail(f"{path.relative_to(GOLDEN)} ({kind} {wid}) no longer replays on this code: "
                    f"{type(result.replay_failure).__name__}: {result.replay_failure}\n"
                    "A workflow change that alters its commands must be behind workflow.patched(...) "
                    "(README: Upgrades).", pytrace=False)
