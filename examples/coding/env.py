"""Coding example: fix a buggy module in a sandboxed workspace; a hidden test grades it.

The workspace (an ssh capability, commands sandboxed with bubblewrap) starts empty; each task
copies the buggy module from ``starter/`` into it. Grading runs ``hidden/test_<module>.py`` with
the graders' ``BashGrader`` -- the test lives outside the workspace, next to this file, where
the agent's sandbox cannot see it -- against the workspace files. The check itself runs in the
same sandbox (the module under test is the agent's code) with ``hidden/`` mounted read-only.

One workspace per served environment: serve one env per concurrent rollout (the subprocess or
docker runtimes do) rather than running several rollouts against one server at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from durable_rollouts.envserver import Environment
from durable_rollouts.envserver.workspace import Mount
from durable_rollouts.graders import BashGrader

HERE = Path(__file__).resolve().parent

env = Environment(name="coding", version="1.0.0")
workspace = env.workspace(None, name="shell", timeout_s=60)  # a fresh temp dir per serve


@env.template(description="Fix the bug in a Python module so that a hidden test passes.")
async def fix_bug(module: str = "mathutils"):
    assert workspace.root is not None, "the workspace starts with the environment"
    source = HERE / "starter" / f"{module}.py"
    if not module.isidentifier() or not source.is_file():
        raise KeyError(module)
    shutil.copy(source, workspace.root / source.name)
    yield (
        f"The Python module `{module}.py` in your workspace (the shell starts there) has a bug. "
        "Read it, fix the bug in place with the shell tool, and reply with a one-line summary "
        "of the fix."
    )
    # The hidden test runs in the workspace's own sandbox (the agent's code is untrusted), with
    # hidden/ mounted read-only at /grader for this one command only.
    tests = "/grader" if workspace.isolation == "bwrap" else str(HERE / "hidden")
    command = workspace.shell_command(
        f"python3 {tests}/test_{module}.py",
        mounts=[Mount(str(HERE / "hidden"), "/grader")],
        env={"PYTHONPATH": "."},
    )
    sub = await BashGrader.grade(command=command, timeout=60)
    yield {"score": sub.value, "subscores": [sub.model_dump(mode="json")]}
