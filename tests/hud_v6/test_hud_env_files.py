"""HUD v6 env files, unchanged, under ``run_direct``, ``rollouts run`` (Temporal), ``rollouts serve``
and ``rollouts task``: the user's ``hud.Environment`` is served by hud's own server.

Fixtures are HUD's own documented examples (``fixtures/README.md``): the quickstart's
``tasks.py`` and the MCP tool-server env of HUD's skill doc.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

hud = pytest.importorskip("hud", reason="needs the hud package (HUD v6): pip install 'durable-rollouts[hud]'")

from cli_helpers import rollouts, rollouts_cmd  # noqa: E402
from hud_agents import LetterCounter, ToolCaller  # noqa: E402
from hud_paths import MCP_ENV, QUICKSTART, announced  # noqa: E402

from durable_rollouts import Task, Taskset  # noqa: E402
from durable_rollouts.protocol import SERVE_PORT_ANNOUNCEMENT  # noqa: E402
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime  # noqa: E402
from durable_rollouts.sdk.direct import run_direct  # noqa: E402

AGENTS = Path(__file__).resolve().parent / "hud_agents.py"


def _huds_slugs() -> list[str]:
    from hud.eval import Taskset as HudTaskset

    return [task.slug for task in HudTaskset.from_file(QUICKSTART)]


@pytest.mark.parametrize("runtime", [LocalRuntime(), SubprocessRuntime()], ids=["local", "subprocess"])
async def test_the_quickstart_file_runs_unchanged_directly(runtime) -> None:
    taskset = Taskset.from_file(QUICKSTART)
    assert taskset.slugs == _huds_slugs() and {t.source for t in taskset} == {str(QUICKSTART)}
    job = await run_direct(taskset, LetterCounter(), runtime)
    assert [run.status for run in job.runs] == ["succeeded"] * 3, [run.error for run in job.runs]
    assert [run.reward for run in job.runs] == [1.0, 1.0, 1.0]
    assert [run.trace.content for run in job.runs] == ["3", "3", "2"]


def test_rollouts_run_grades_every_quickstart_task_through_temporal(embedded_server) -> None:
    result = rollouts("run", str(QUICKSTART), "--agent", f"{AGENTS}:LetterCounter", "--json", timeout=120)
    assert result.code == 0, result.err[-3000:]
    job = result.json()
    assert job["counts"].get("succeeded") == 3 and job["reward"] == 1.0
    assert job["agent"] == "hud_agents:LetterCounter" and job["runtime"] == "local"
    assert sorted(r["slug"] for r in job["rollouts"]) == sorted(_huds_slugs())
    assert "Traceback" not in result.err


def test_rollouts_serve_and_task_commands_drive_a_hud_env_file() -> None:
    with announced([*rollouts_cmd(), "serve", str(QUICKSTART)], SERVE_PORT_ANNOUNCEMENT) as url:
        listed = rollouts("task", "list", "--url", url, "--json")
        assert listed.code == 0, listed.err
        huds_own = [t.manifest_entry() for t in _quickstart_env().tasks.values()]
        assert json.loads(listed.out) == huds_own
        started = rollouts("task", "start", "count_letter", "--args", '{"word": "banana", "letter": "a"}', "--url", url)
        assert started.code == 0, started.err
        assert started.out.strip() == "How many 'a's are in 'banana'? Reply with just the number."
        graded = rollouts("task", "grade", "count_letter", "--answer", "3", "--url", url)
        assert graded.code == 0, graded.err
        assert json.loads(graded.out)["score"] == 1.0


def _quickstart_env():
    from hud.environment import load_environment

    return load_environment(QUICKSTART)


async def test_an_mcp_tool_published_by_a_hud_env_reaches_a_hud_agent() -> None:
    taskset = Taskset("mcp", [Task(env="my-env", id="my_task", source=str(MCP_ENV))])
    job = await run_direct(taskset, ToolCaller(), LocalRuntime())
    run = job.runs[0]
    assert run.status == "succeeded", run.error
    assert run.trace.content == "result: 42" and run.reward == 1.0
    assert [b["name"] for b in run.bindings] == ["tools"]


def test_a_hud_env_is_only_served_on_loopback_without_a_token() -> None:
    with_token = rollouts("serve", str(QUICKSTART), ROLLOUTS_ENV_TOKEN="secret")
    assert with_token.code == 2 and "no token authentication" in with_token.err
    assert len(with_token.err.strip().splitlines()) == 1
    public = rollouts("serve", str(QUICKSTART), "--host", "0.0.0.0", ROLLOUTS_ENV_TOKEN="secret")
    assert public.code == 2 and "no token authentication" in public.err

