"""Seed snippets ported by renaming ``hud`` to ``durable_rollouts`` (the env files under
``envs/`` say which snippet each is; a task the seed leaves out is marked as ours), run through
``run_direct`` and, where the seed runs a batch, ``Taskset.run`` on a real Temporal dev server.

Also here, ported in other files: seed 004's MCP tool server (``test_shutdown_hook.py``), seed
001's placement and routing patterns (``test_placement.py``, ``test_durable_seeds.py``), seed 000's
``rollout()`` and seeds 002/004's ``Task.run`` (``test_durable_seeds.py``), the module paths
(``test_module_paths.py``).

Not ported, and why:
- hud.ai's cloud: ``Taskset.from_api``, ``hud deploy``/``hud sync``, ``TrainingClient`` and its
  loops (seeds 002, 004), ``create_agent(model)`` (needs HUD's gateway), ``HostedRuntime``.
- Agents we do not ship: ``BrowserUseAgent``, ``hud.tools`` (``BashTool``, ``EditTool``),
  ``hud.native``.
- Robots: ``hud.environment.robot`` (``RobotEndpoint``, ``MainThreadSimRunner``).
- Seed 002's desktop (``Xvfb``/``x11vnc``, not installed here) and the coding-agent cookbook
  (needs a model); the CLI snippets (``hud init``, ``uv``) and Dockerfiles.
- ``Agent`` with a HUD-style ``__init__``: ``test_hud_style_agent.py``. The signatures
  (``DockerRuntime(run_args=(...))``, ``ModalRuntime(image_name, *, image=<modal.Image>,
  app_name=)`` against the Modal stand-in, ``Environment(capabilities=)``, ``env.serve()``,
  ``connect``, ``hello()`` returning the Manifest) are checked in ``test_signatures.py``;
  running Docker or Modal is the providers' tests' job.
- Seed 003 (lazy tasksets: ``REQUIRES_GROUP_ROLLOUTS``, ``NEEDS_CONTAINER``, the deriving replay
  taskset, staged conversations): not built yet.
- Seed 002's ``Mount`` workspace is declared here but not served: it needs ``/data`` and
  ``/workspace`` on the host. "Serve Custom Tools with FastMCP" binds the fixed port 8040 (a
  shared test machine); the MCP example of seed 002 that picks a free port is ported instead.
  "Environment Setup and Task Definition" grades with ``LLMJudgeGrader`` (a model); "Stateful
  Environment" needs PostgreSQL; "Launch and Publish a Daemon" calls placeholders
  (``start_daemon``); "Launch Chromium" needs Playwright's browser; ``trace.final`` and
  ``AgentStep`` are not ours.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_rollouts import Job, LocalRuntime, Runtime, Taskset
from durable_rollouts.environment import Environment, Mount
from durable_rollouts.envserver import load_environment, serving
from durable_rollouts.errors import ConfigError
from durable_rollouts.sdk.agents import Agent, FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run

ENVS = Path(__file__).parent / "envs"
LETTER_COUNT = ENVS / "letter_count.py"


def count_letter():
    """The seed's ``count_letter`` template (the seed calls it from its own module)."""
    return load_environment(str(LETTER_COUNT)).templates["count_letter"]


async def test_seed_004_golden_path_grades_each_word() -> None:
    ts = Taskset.from_file(LETTER_COUNT)
    job = await run_direct(ts, FixedAgent(answer="3"), LocalRuntime(LETTER_COUNT))
    # strawberry and raspberry have three r's, blueberry two
    assert [(r.task.args["word"], r.grade.reward) for r in job.runs] == [
        ("strawberry", 1.0), ("raspberry", 1.0), ("blueberry", 0.0)]


class ShellNoteAgent(Agent):
    """Writes the note through the workspace's ssh capability and answers with what it reads."""

    async def __call__(self, run: Run) -> None:
        assert [b["protocol"] for b in run.bindings if b["name"] == "shell"] == ["ssh/2"]
        conn = await run.open("shell")
        text = run.task.args["text"]
        result = await conn.run(f"echo {text} > note.txt && cat note.txt", check=False)
        run.trace.content = result.stdout.strip()


@pytest.mark.parametrize("snippet", ["workspace_auto.py", "workspace_manual.py"])
async def test_seed_002_workspace_snippets_publish_a_working_shell(
        snippet: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the seed's relative "workspace"
    job = await run_direct(Taskset.from_file(ENVS / snippet), ShellNoteAgent())  # runtime=None
    assert job.runs[0].reward == 1.0, job.runs[0].error
    assert (tmp_path / "workspace" / "note.txt").read_text() == "hello\n"


def test_seed_002_mount_snippet_declares_a_read_only_mount() -> None:
    env = load_environment(str(ENVS / "workspace_mounts.py"), fresh=True)
    assert Mount("ro", src="/data", dst="/data") == Mount("/data", "/data", writable=False)
    assert Mount("rw", src="/a", dst="/b") == Mount("/a", "/b", writable=True)
    assert len(env._initialize) == 1  # the workspace starts when the env serves
    with pytest.raises(ValueError, match="only the 'ro', 'rw' and 'bind' kinds"):
        Mount("tmpfs", dst="/tmp")


def test_taskset_from_a_directory_loads_every_file(tmp_path: Path) -> None:
    for name in ("letter_count.py", "group_state.py", "group_state_helper.py", "workspace_mounts.py"):
        (tmp_path / name).write_text((ENVS / name).read_text())
    ts = Taskset.from_file(tmp_path)
    assert ts.name == tmp_path.name and sorted(t.env for t in ts) == ["group-state"] + ["letter-count"] * 3
    assert {t.source for t in ts if t.env == "letter-count"} == {str(tmp_path / "letter_count.py")}
    with pytest.raises(ConfigError, match="duplicate task slug 'write_note-"):
        Taskset.from_file(ENVS)  # two files declare the same task


class ToolAgent(Agent):
    """Calls the MCP tool the environment publishes and answers with its result."""

    async def __call__(self, run: Run) -> None:
        mcp = await run.open("tools")
        result = await mcp.call_tool("do_thing", {"x": 42})
        run.trace.content = str(result.data)


async def test_seed_002_mcp_capability_serves_its_tool_to_each_rollout() -> None:
    ts = Taskset.from_file(ENVS / "mcp_capability.py")
    job = await run_direct(ts, ToolAgent(), group=2)  # each member its own tool server
    assert [(r.status, r.grade.reward, r.trace.content) for r in job.runs] == [
        ("succeeded", 1.0, "result: 42")] * 2


async def test_seed_002_a_task_returning_an_integer_gets_an_answer_of_int() -> None:
    job = await run_direct(Taskset.from_file(ENVS / "answer_int.py"), FixedAgent(answer="10"))
    assert [(r.task.args["word"], r.grade.reward) for r in job.runs] == [
        ("strawberry", 1.0), ("kiwi", 0.0)]


def test_seed_002_creating_and_loading_tasksets(tmp_path: Path) -> None:
    """Seed 002, "Creating and Loading Tasksets" and "Instantiate a Task" (not ``from_api``)."""
    count_letter_ = count_letter()
    task = count_letter_(word="raspberry")   # a Task row, not yet run
    ts = Taskset("letters", [count_letter_(word="strawberry"), task])
    assert [t.args["word"] for t in ts] == ["strawberry", "raspberry"]
    assert len(Taskset.from_file(LETTER_COUNT)) == 3  # from a Python source
    ts.to_file(tmp_path / "tasks.jsonl")
    again = Taskset.from_file(tmp_path / "tasks.jsonl")  # from a data file
    assert [t.slug for t in again] == ts.slugs and again[1].source == str(LETTER_COUNT)
    assert Environment(name="environment", version="0.0.1", capabilities=None).capabilities == []


# -- the durable path -------------------------------------------------------------------------


@pytest.mark.slow
async def test_seed_002_running_tasks_and_tasksets(client, task_queue) -> None:
    """Seed 002, "Running Tasks and Tasksets" (``env.py`` is the golden path's file)."""
    agent, ts, temporal = FixedAgent(answer="3"), Taskset.from_file(LETTER_COUNT), {
        "temporal": client, "worker": True, "task_queue": task_queue}
    # one task
    job = await count_letter()(word="strawberry").run(agent, runtime=LocalRuntime(LETTER_COUNT),
                                                      **temporal)
    assert isinstance(job, Job) and job.reward == 1.0
    # a whole taskset: 8 rollouts per task, capped concurrency
    job = await ts.run(agent, runtime=LocalRuntime(LETTER_COUNT), group=8, max_concurrent=10,
                       **temporal)
    assert len(job.runs) == 24 and job.reward == pytest.approx(2 / 3)


@pytest.mark.slow
async def test_seed_002_job_start_accumulates_runs(client, task_queue) -> None:
    """Seed 002, "Start a New Job for Multiple Runs" (two epochs)."""
    agent, ts, epochs = FixedAgent(answer="3"), Taskset.from_file(LETTER_COUNT), 2
    job = await Job.start("grpo-session", group=8)
    for step in range(epochs):
        await ts.run(agent, runtime=LocalRuntime(LETTER_COUNT), job=job, temporal=client,
                     worker=True, task_queue=task_queue)   # all runs accumulate here
    assert len(job.runs) == epochs * 3 * 8 and len({r.group_id for r in job.runs}) == epochs * 3


@dataclass
class _Sandbox:
    """A stand-in for the seed's "your infra": the env served on a loopback port."""

    host: str
    port: int
    stop: object

    async def terminate(self) -> None:
        await self.stop()


TERMINATED: list[int] = []


async def start_my_sandbox(image: str) -> _Sandbox:
    assert image == "my-env"
    entered = serving(load_environment(str(LETTER_COUNT), fresh=True))
    server = await entered.__aenter__()

    async def stop() -> None:
        TERMINATED.append(server.port)
        await entered.__aexit__(None, None, None)

    return _Sandbox("127.0.0.1", server.port, stop)


@asynccontextmanager
async def my_runtime(task):
    sandbox = await start_my_sandbox(image="my-env")   # your infra brings it up
    try:
        yield Runtime(f"tcp://{sandbox.host}:{sandbox.port}")
    finally:
        await sandbox.terminate()                       # ...and tears it down


@pytest.mark.slow
async def test_seed_002_define_a_custom_runtime(client, task_queue) -> None:
    """Seed 002, "Define a Custom Runtime": ``await TASKS.run(agent, runtime=my_runtime)``."""
    TASKS, agent = Taskset.from_file(LETTER_COUNT), FixedAgent(answer="3")
    TERMINATED.clear()
    job = await TASKS.run(agent, runtime=my_runtime, temporal=client, worker=True,
                          task_queue=task_queue)
    assert [r.grade.reward for r in job.runs] == [1.0, 1.0, 0.0]
    assert len(TERMINATED) == 3  # each sandbox torn down

