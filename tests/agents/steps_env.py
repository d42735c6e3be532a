"""A workspace env for the durable-turn tests: the agent must run ``echo step-K >> log.txt``.

``steps`` asks for ``n`` shell commands in a sandboxed ssh workspace (bwrap) and grades the log:
1.0 only when ``log.txt`` reads ``step-1`` .. ``step-n`` exactly once each, in order. Every real
grade appends the log's lines (comma-joined, one line per grade) to ``grade_log``, and the workspace
path is written to ``ws_file`` at start, so a test can count side effects on the host.
"""

from __future__ import annotations

from durable_rollouts.envserver import Environment

env = Environment(name="steps", version="1.0.0")
workspace = env.workspace(None, name="shell", timeout_s=60)


@env.template(description="Run `echo step-K >> log.txt` for K = 1..n, then answer 'done'.")
async def steps(n: int = 6, grade_log: str = "", ws_file: str = ""):
    assert workspace.root is not None
    log = workspace.root / "log.txt"
    log.unlink(missing_ok=True)
    if ws_file:
        with open(ws_file, "w") as fh:
            fh.write(str(workspace.root))
    yield (f"Run the shell command `echo step-K >> log.txt` for K = 1 to {n}, one command per "
           "tool call, then answer 'done'.")
    lines = log.read_text().splitlines() if log.exists() else []
    if grade_log:
        with open(grade_log, "a") as fh:
            fh.write(",".join(lines) + "\n")
        calls = workspace.root / "calls.txt"
        if calls.exists():  # the side-effect log of an idempotent command
            with open(grade_log + ".calls", "a") as fh:
                fh.write(calls.read_text())
    yield 1.0 if lines == [f"step-{k}" for k in range(1, n + 1)] else 0.0
