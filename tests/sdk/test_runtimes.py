"""Built-in providers: specs, idempotent acquire/release by key, and substrates that outlive
the process that placed them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_rollouts import LocalRuntime, Runtime, SubprocessRuntime, Task
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import ProviderSpec
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.runtimes.subprocess import substrate_dir
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset

REPO = Path(__file__).resolve().parents[2]
LETTERS = REPO / "examples" / "letters" / "env.py"
ROW = Task(env="letters", id="count_letter", args={"word": "banana", "letter": "a"}, source=str(LETTERS))

live_env = Environment(name="live", version="0.1.0")


@live_env.template()
async def ping():
    answer = yield "ping?"
    yield 1.0 if answer == "pong" else 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def test_specs_rebuild_equal_providers() -> None:
    for provider in (Runtime("tcp://127.0.0.1:9", params={"token": "t"}), LocalRuntime(LETTERS),
                     SubprocessRuntime(LETTERS, ready_timeout=5)):
        spec = ProviderSpec.model_validate_json(provider.spec().model_dump_json())
        rebuilt = provider_from_spec(spec)
        assert type(rebuilt) is type(provider) and rebuilt.spec() == provider.spec()
    assert (Runtime.locality, LocalRuntime.locality, SubprocessRuntime.locality) == ("global", "process", "host")
    with pytest.raises(ConfigError, match="unknown provider kind"):
        provider_from_spec(ProviderSpec(kind="teleport"))


def test_a_live_environment_becomes_a_spec_only_this_process_can_use() -> None:
    runtime = LocalRuntime(live_env)
    spec = runtime.spec()
    assert set(spec.options) == {"instance"}
    assert provider_from_spec(spec) is runtime  # an in-process worker uses the object itself
    with pytest.raises(ConfigError, match="pass the env file path"):  # a worker elsewhere
        provider_from_spec(ProviderSpec(kind="local", options={"instance": "from-elsewhere"}))


async def test_a_live_environment_still_runs_in_process() -> None:
    ts = Taskset("live", [Task(env="live", id="ping")])
    job = await run_direct(ts, FixedAgent(answer="pong"), LocalRuntime(live_env), group=3)
    assert job.reward == 1.0 and len({r.rollout_id for r in job.runs}) == 3


async def test_a_borrowed_runtime_is_its_own_no_op_provider() -> None:
    async with serving(live_env) as server:
        runtime = Runtime(server.url)
        async with runtime(ROW) as rt:
            assert rt is runtime
        endpoint = await runtime.acquire(ROW, "k")
        await runtime.release(endpoint)
        client = await connect(server.url, ready_timeout=2)  # still serving: borrowed, not owned
        await client.bye()


async def test_local_runtime_acquire_is_idempotent_by_key() -> None:
    runtime = LocalRuntime(LETTERS)
    a = await runtime.acquire(ROW, "same-key")
    b = await runtime.acquire(ROW, "same-key")
    assert a.url == b.url
    await runtime.release(a)
    await runtime.release(b)


async def test_the_provider_face_yields_a_runtime_and_cleans_up() -> None:
    provider = SubprocessRuntime(LETTERS)
    async with provider(ROW) as rt:
        client = await connect(rt.url, ready_timeout=5)
        prompt = await client.start_task(ROW.id, ROW.args)
        assert "banana" in prompt["prompt"]
        assert (await client.grade("3"))["score"] == 1.0
        await client.bye()


async def test_subprocess_acquire_reuses_a_live_substrate_and_replaces_a_dead_one() -> None:
    runtime = SubprocessRuntime(LETTERS)
    first = await runtime.acquire(ROW, "reuse-key")
    try:
        again = await runtime.acquire(ROW, "reuse-key")
        assert again.handle["pid"] == first.handle["pid"] and again.url == first.url
        assert Path(first.handle["log"]).parent == substrate_dir("reuse-key")
        os.killpg(first.handle["pgid"], signal.SIGKILL)
        for _ in range(100):
            if not _alive(first.handle["pid"]):
                break
            import time

            time.sleep(0.02)
        replaced = await runtime.acquire(ROW, "reuse-key")
        assert replaced.handle["pid"] != first.handle["pid"]
        await runtime.release(replaced)
    finally:
        await runtime.release(first)
        await runtime.release(first)  # idempotent, also when already gone
    assert not (substrate_dir("reuse-key") / "state.json").exists()


async def test_a_subprocess_substrate_outlives_the_process_that_placed_it(tmp_path: Path) -> None:
    """A worker placing the env and then dying (SIGKILL) leaves the env serving; another
    process finds it by key and releases it."""
    code = (
        "import asyncio, sys\n"
        "from durable_rollouts.models import Task\n"
        "from durable_rollouts.runtimes import SubprocessRuntime\n"
        "task = Task.model_validate_json(sys.argv[1])\n"
        "async def main():\n"
        "    ep = await SubprocessRuntime(sys.argv[2]).acquire(task, 'orphan-key')\n"
        "    print(ep.model_dump_json(), flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code, ROW.model_dump_json(), str(LETTERS)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        endpoint = json.loads(worker.stdout.readline())
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()
    runtime = SubprocessRuntime(LETTERS)
    try:
        assert _alive(endpoint["handle"]["pid"])
        found = await runtime.acquire(ROW, "orphan-key")
        assert found.handle["pid"] == endpoint["handle"]["pid"]
        client = await connect(found.url, ready_timeout=5)
        await client.bye()
    finally:
        await runtime.release(found)
    assert not _alive(endpoint["handle"]["pid"])


async def test_subprocess_task_data_is_not_on_the_command_line() -> None:
    runtime = SubprocessRuntime(LETTERS)
    secret = Task(env="letters", id="count_letter", args={"word": "secret-word-xyz"}, source=str(LETTERS))
    endpoint = await runtime.acquire(secret, "argv-key")
    try:
        cmdline = Path(f"/proc/{endpoint.handle['pid']}/cmdline").read_bytes()
        environ = Path(f"/proc/{endpoint.handle['pid']}/environ").read_bytes()
        assert b"secret-word-xyz" not in cmdline and b"secret-word-xyz" not in environ
    finally:
        await runtime.release(endpoint)


hooked = Environment(name="hooked", version="0.1.0")
HOOKS: list[str] = []


@hooked.initialize
async def _up() -> None:
    HOOKS.append("up")


@hooked.shutdown
async def _down() -> None:
    HOOKS.append("down")


@hooked.template()
async def echo():
    answer = yield "say ok"
    yield 1.0 if answer == "ok" else 0.0


async def test_local_runtime_serves_one_object_once_while_rollouts_come_and_go() -> None:
    """Acquisitions overlap and drain repeatedly; the env is never stopped under a live rollout
    and its hooks stay balanced."""
    HOOKS.clear()
    ts = Taskset("hooked", [Task(env="hooked", id="echo")])
    runtime = LocalRuntime(hooked)
    for _ in range(3):
        job = await run_direct(ts, FixedAgent(answer="ok"), runtime, group=12, max_concurrent=4)
        assert job.reward == 1.0 and len(job.runs) == 12
    assert HOOKS.count("up") == HOOKS.count("down") >= 1
    assert all(a != b for a, b in zip(HOOKS, HOOKS[1:]))  # strictly up, down, up, down ...
