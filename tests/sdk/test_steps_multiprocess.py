"""Every rollout step can run in a fresh process: the session lives on in the env server.

Three separate ``python -c`` processes share only pydantic JSON files: (1) provision, connect and
start against a SubprocessRuntime env; (2) run the agent; (3) grade and tear down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durable_rollouts.models import Endpoint, Grade
from durable_rollouts.runtimes.subprocess import substrate_dir
from durable_rollouts.step_io import AgentResult
from durable_rollouts.stores.tracestore import TraceStore

REPO = Path(__file__).resolve().parents[2]
LETTERS = REPO / "examples" / "letters" / "env.py"

PHASE_1 = """
import asyncio, json, sys
from pathlib import Path
from durable_rollouts.models import Task
from durable_rollouts.step_io import (
    ConnectInput,
    ProvisionInput,
    StartInput,
)
from durable_rollouts.steps import substrate as steps
from durable_rollouts.runtimes import SubprocessRuntime

out = Path(sys.argv[1])
task = Task(env="letters", id="count_letter", args={"word": "banana", "letter": "a"}, source=sys.argv[2])

async def main():
    endpoint = await steps.provision(ProvisionInput(key=sys.argv[3], task=task,
                                                    provider=SubprocessRuntime(sys.argv[2]).spec()))
    session = await steps.connect(ConnectInput(endpoint=endpoint))
    prompt = await steps.start(StartInput(endpoint=endpoint, session=session, task=task))
    (out / "task.json").write_text(task.model_dump_json())
    (out / "endpoint.json").write_text(endpoint.model_dump_json())
    (out / "session.json").write_text(session.model_dump_json())
    (out / "prompt.json").write_text(json.dumps(prompt))

asyncio.run(main())
"""

PHASE_2 = """
import asyncio, json, sys
from pathlib import Path
from durable_rollouts.models import (
    AgentSpec,
    Endpoint,
    Session,
    Task,
)
from durable_rollouts.step_io import AgentInput
from durable_rollouts.sdk.agents import load_agent
from durable_rollouts.sdk.run import Run
from durable_rollouts.steps import agent as agent_step
from durable_rollouts.steps import substrate as steps

out = Path(sys.argv[1])
beats = []

async def main():
    inp = AgentInput(
        endpoint=Endpoint.model_validate_json((out / "endpoint.json").read_text()),
        session=Session.model_validate_json((out / "session.json").read_text()),
        task=Task.model_validate_json((out / "task.json").read_text()),
        prompt=json.loads((out / "prompt.json").read_text()),
        agent=AgentSpec(path="sleep", config={"seconds": 1.2, "answer": "3"}),
        rollout_id="mp-rollout", job_id="mp-job", group_id="mp-group",
    )
    result = await agent_step.run_agent(inp, agent=load_agent(inp.agent), new_run=Run.for_step,
                                        heartbeat=lambda: beats.append(1))
    (out / "agent.json").write_text(result.model_dump_json())
    (out / "beats.txt").write_text(str(len(beats)))

asyncio.run(main())
"""

PHASE_3 = """
import asyncio, sys
from pathlib import Path
from durable_rollouts.models import Endpoint, Session
from durable_rollouts.step_io import (
    AgentResult,
    GradeInput,
    TeardownInput,
)
from durable_rollouts.steps import substrate as steps

out = Path(sys.argv[1])

async def main():
    endpoint = Endpoint.model_validate_json((out / "endpoint.json").read_text())
    session = Session.model_validate_json((out / "session.json").read_text())
    result = AgentResult.model_validate_json((out / "agent.json").read_text())
    grade = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer=result.content))
    again = await steps.grade(GradeInput(endpoint=endpoint, session=session, answer="wrong"))
    assert again == grade, (again, grade)  # grading is idempotent per session
    (out / "grade.json").write_text(grade.model_dump_json())
    await steps.teardown(TeardownInput(endpoint=endpoint, session=session))
    await steps.teardown(TeardownInput(endpoint=endpoint, session=session))  # idempotent

asyncio.run(main())
"""


def _phase(code: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_step_runs_in_its_own_process(tmp_path: Path) -> None:
    key = "mp-rollout"
    try:
        _phase(PHASE_1, str(tmp_path), str(LETTERS), key)
        endpoint = Endpoint.model_validate_json((tmp_path / "endpoint.json").read_text())
        assert endpoint.handle["pid"] and (substrate_dir(key) / "state.json").exists()
        assert "banana" in json.loads((tmp_path / "prompt.json").read_text())["prompt"]

        _phase(PHASE_2, str(tmp_path))
        result = AgentResult.model_validate_json((tmp_path / "agent.json").read_text())
        assert result.content == "3" and result.status == "completed"
        assert int((tmp_path / "beats.txt").read_text()) >= 2  # heartbeats while the agent ran
        trace = TraceStore().get(result.trace_ref)
        assert trace.trace_id == "mp-rollout" and trace.content == "3"

        _phase(PHASE_3, str(tmp_path))
        grade = Grade.model_validate_json((tmp_path / "grade.json").read_text())
        assert grade.reward == 1.0 and not grade.is_error
        assert not (substrate_dir(key) / "state.json").exists()
    finally:  # a failed phase must not leave the env server behind
        state = substrate_dir(key) / "state.json"
        if state.exists():
            import os
            import signal

            pid = json.loads(state.read_text())["pid"]
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            state.unlink()
