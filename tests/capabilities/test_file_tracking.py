"""``file_tracking_observer``: workspace files added, modified and deleted while a block runs.

Real parts: a served env with a real ssh workspace (bwrap when it works here, else unsandboxed),
reached through ``tunnel.open``; the agent test runs the whole direct rollout path and export.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from durable_rollouts import Capability, Environment, Taskset, file_tracking_observer
from durable_rollouts.client.capabilities import CapabilityNotFoundError
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import serving
from durable_rollouts.errors import InvalidStateError
from durable_rollouts.models import Trace
from durable_rollouts.runtimes import LocalRuntime
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run

REPO = Path(__file__).resolve().parents[2]


def _workspace_env(root: Path) -> Environment:
    root.mkdir(parents=True, exist_ok=True)
    (root / "keep.txt").write_text("unchanged\n")
    (root / "edit.txt").write_text("before\n")
    (root / "gone.txt").write_text("bye\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: main\n")
    env = Environment(name="tracked")
    env.workspace(root)

    @env.template()
    async def write_notes():
        answer = yield "Write notes.md, change edit.txt, remove gone.txt."
        yield 1.0 if (root / "notes.md").exists() and answer == "done" else 0.0

    return env


async def test_the_observer_reports_added_modified_and_deleted_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    async with serving(_workspace_env(root)) as server, \
            await connect(server.url, keepalive_s=None) as client:
        shell = await client.open("shell")
        trace = Trace()
        async with file_tracking_observer(client, trace=trace) as files:
            done = await shell.run(
                "echo after > edit.txt; rm gone.txt; mkdir -p src/deep; echo x > 'src/deep/a b.py';"
                " touch keep.txt; echo noise >> .git/HEAD; echo y > notes.md", check=False)
            assert done.exit_status == 0, done.stderr
    assert files.tracked and files.error is None
    assert [(c.path, c.status, c.size_before, c.size_after) for c in files.changes] == [
        ("edit.txt", "modified", 7, 6),
        ("gone.txt", "deleted", 4, None),
        ("notes.md", "added", None, 2),
        ("src/deep/a b.py", "added", None, 2),
    ]  # keep.txt was only touched (same content), .git is skipped
    assert (files.files_before, files.files_after, files.changed) == (3, 4, 4)
    assert files.root in ("/workspace", str(root)) and files.scan_ms > 0
    assert trace.extra["files"] == files.model_dump(mode="json")


async def test_a_file_over_the_hash_limit_is_compared_by_size_and_mtime(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    async with serving(_workspace_env(root)) as server, \
            await connect(server.url, keepalive_s=None) as client:
        shell = await client.open("shell")
        await shell.run("head -c 4096 /dev/zero > big.bin", check=True)
        async with file_tracking_observer(client, max_hash_bytes=1024) as same_size:
            await shell.run("head -c 4096 /dev/urandom > big.bin && touch -d '2001-01-01' big.bin",
                            check=True)
        async with file_tracking_observer(client, max_hash_bytes=1024) as untouched:
            await shell.run("cat big.bin > /dev/null", check=True)
    assert [(c.path, c.status) for c in same_size.changes] == [("big.bin", "modified")]
    assert untouched.changes == [] and untouched.tracked


async def test_an_agent_records_its_file_changes_in_the_exported_trace(tmp_path: Path) -> None:
    root = tmp_path / "ws"

    class NotesAgent(Agent):
        async def __call__(self, run: Run) -> None:
            shell = await run.open("shell")
            async with file_tracking_observer(run):
                await shell.run("echo '# notes' > notes.md && echo changed > edit.txt", check=True)
            run.trace.content = "done"

    env = _workspace_env(root)
    job = await run_direct(Taskset("notes", [env.templates["write_notes"]()]), NotesAgent(),
                           LocalRuntime(env))
    run = job.runs[0]
    assert run.reward == 1.0, run.error
    files = run.trace.extra["files"]
    assert [(c["path"], c["status"]) for c in files["changes"]] == [
        ("edit.txt", "modified"), ("notes.md", "added")]
    exported = job.export(tmp_path / "out.jsonl")
    line = json.loads(exported.read_text().splitlines()[0])
    assert line["trace"]["extra"]["files"] == files


async def test_a_failing_block_still_records_its_changes_and_raises(tmp_path: Path) -> None:
    async with serving(_workspace_env(tmp_path / "ws")) as server, \
            await connect(server.url, keepalive_s=None) as client:
        shell = await client.open("shell")
        trace = Trace()
        with pytest.raises(RuntimeError, match="agent broke"):
            async with file_tracking_observer(client, trace=trace):
                await shell.run("echo partial > half.txt", check=True)
                raise RuntimeError("agent broke")
    assert [c["path"] for c in trace.extra["files"]["changes"]] == ["half.txt"]


async def test_changes_beyond_max_changes_are_counted_not_listed(tmp_path: Path) -> None:
    async with serving(_workspace_env(tmp_path / "ws")) as server, \
            await connect(server.url, keepalive_s=None) as client:
        shell = await client.open("shell")
        async with file_tracking_observer(client, max_changes=5) as files:
            await shell.run("for i in $(seq 10 29); do echo $i > f$i; done", check=True)
    assert files.changed == 20 and files.truncated
    assert [c.path for c in files.changes] == [f"f{i}" for i in range(10, 15)]


async def test_an_env_without_a_workspace_is_not_tracked_and_the_block_runs(tmp_path: Path) -> None:
    env = Environment(name="bare")
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        trace = Trace()
        ran = False
        async with file_tracking_observer(client, trace=trace) as files:
            ran = True
        assert ran and not files.tracked and files.changes == []
        assert "files" not in trace.extra
        with pytest.raises(CapabilityNotFoundError, match="no capability 'shell'"):
            async with file_tracking_observer(client, capability="shell"):
                pass


async def test_a_workspace_that_cannot_be_listed_reports_the_error_not_raises(tmp_path: Path) -> None:
    env = _workspace_env(tmp_path / "ws")

    @env.initialize
    async def publish_a_missing_directory() -> None:  # the same ssh server, a cwd that is not there
        shell = env.capability("shell")
        env.add_capability(shell.model_copy(update={
            "name": "elsewhere", "params": {**shell.params, "cwd": "/no/such/dir"}}))

    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        trace = Trace()
        ran = False
        async with file_tracking_observer(client, trace=trace, capability="elsewhere") as files:
            ran = True
    assert ran and not files.tracked
    assert "the first listing failed" in (files.error or "") and "exited 3" in (files.error or "")
    assert trace.extra["files"]["error"] == files.error


async def test_observing_a_run_outside_its_agent_step_is_an_invalid_state() -> None:
    with pytest.raises(InvalidStateError, match="connected run"):
        async with file_tracking_observer(Run()):
            pass


async def test_the_readmes_capabilities_block_runs_as_written(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    section = text.split("### Capabilities and runtime config\n", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    env = _workspace_env(tmp_path / "ws")  # its workspace replaces the block's own "shell" at serve
    names: dict = {"env": env, "Agent": Agent, "Run": Run, "host_key": "ssh-ed25519 AAAA",
                   "private_key": "<key>", "binding": Capability.rfb(url="rfb://h").manifest()}
    exec(compile(block, "README.md", "exec"), names)
    assert names["config"].resources.gpu.type == "A100"
    assert {c.name for c in env.capabilities} == {"tools", "browser", "screen", "arm", "shell"}
    job = await run_direct(Taskset("readme", [env.templates["write_notes"]()]), names["MyAgent"](),
                           LocalRuntime(env))
    assert job.runs[0].reward == 1.0, job.runs[0].error
    assert [c["path"] for c in job.runs[0].trace.extra["files"]["changes"]] == ["notes.md"]
