"""Seed 001's placement: any ``(task) -> async context manager yielding a Runtime`` is a
provider, routing is composition, and ``runtime=None`` resolves a default.

Through ``run_direct`` here; the durable path (``Taskset.run`` on Temporal) is in
``test_durable_seeds.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import seed_providers

from durable_rollouts import LocalRuntime, Runtime, Task, Taskset
from durable_rollouts.envserver import load_environment, serving
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import ProviderSpec
from durable_rollouts.runtimes import provider_from_spec
from durable_rollouts.runtimes.callables import CallableProvider, as_provider
from durable_rollouts.sdk.agents import Agent, FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run

ENVS = Path(__file__).parent / "envs"
GROUP_STATE = ENVS / "group_state.py"


def group_state() -> Taskset:
    return Taskset.from_file(GROUP_STATE)


class NotingAgent(Agent):
    """Answers, and notes what the provider had done when the agent ran."""

    seen: list[list[str]] = []

    async def __call__(self, run: Run) -> None:
        self.seen.append(list(seed_providers.EVENTS))
        run.trace.content = "x"


async def test_an_asynccontextmanager_function_is_a_provider_and_exits_after_grading() -> None:
    seed_providers.EVENTS.clear()
    agent = NotingAgent(seen=[])
    job = await run_direct(group_state(), agent, seed_providers.serve_group_state, group=2)
    assert [r.status for r in job.runs] == ["succeeded"] * 2
    assert sorted(seed_providers.EVENTS) == ["enter probe"] * 2 + ["exit probe"] * 2
    assert all("exit probe" not in seen for seen in agent.seen)  # exit comes at teardown
    assert {r.grade.info["inits"] for r in job.runs} == {1}  # its own env per rollout


async def test_a_routing_lambda_over_a_dict_of_providers() -> None:
    """Seed 001, "Route rows across providers"."""
    other = ENVS / "mcp_tools.py"
    providers = {"group-state": LocalRuntime(GROUP_STATE), "my-env": LocalRuntime(other)}
    runtime = lambda task: providers[task.env](task)  # noqa: E731  (the seed's own form)
    rows = Taskset("mixed", [*group_state(), *Taskset.from_file(other)])
    job = await run_direct(rows, FixedAgent(answer="result: 1"), runtime)
    assert [(r.task.env, r.status, r.grade.reward) for r in job.runs] == [
        ("group-state", "succeeded", 1.0), ("my-env", "succeeded", 1.0)]


async def test_a_routing_lambda_over_warm_runtimes_borrows_them() -> None:
    """Seed 001, "Borrow warm substrates": entering a Runtime provisions nothing."""
    env = load_environment(str(GROUP_STATE), fresh=True)
    async with serving(env) as server:
        servers = {"probe": Runtime(server.url)}
        runtime = lambda task: servers[task.id](task)  # noqa: E731
        job = await run_direct(group_state(), FixedAgent(answer="x"), runtime, group=3,
                               max_concurrent=1)
        infos = [r.grade.info for r in job.runs]
        assert {i["env"] for i in infos} == {id(env)} and {i["inits"] for i in infos} == {1}
        assert sorted(i["seen"] for i in infos) == [1, 2, 3]  # one warm world, shared
        assert env.started  # still served: the borrower tore nothing down


async def test_runtime_none_serves_rows_from_their_env_file() -> None:
    job = await run_direct(group_state(), FixedAgent(answer="x"), group=2)
    assert [r.status for r in job.runs] == ["succeeded"] * 2
    assert [r.grade.info["inits"] for r in job.runs] == [1, 1]


async def test_runtime_none_with_rows_naming_no_file_names_the_forms() -> None:
    rows = Taskset("bare", [Task(env="declared-nowhere", id="probe")])
    with pytest.raises(ConfigError, match=r"name no env.py file.*LocalRuntime\('env.py'\).*any \(task\)"):
        await run_direct(rows, FixedAgent(answer="x"))


async def test_a_provider_that_is_not_callable_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="runtime must be a provider"):
        await run_direct(group_state(), FixedAgent(answer="x"), {"probe": "tcp://x:1"})


async def test_a_callable_returning_no_context_manager_fails_the_rollout_clearly() -> None:
    job = await run_direct(group_state(), FixedAgent(answer="x"), lambda task: "tcp://127.0.0.1:1")
    run = job.runs[0]
    assert run.status == "failed" and "not an async context manager" in run.error


def test_workers_elsewhere_import_a_module_level_provider_by_path() -> None:
    provider = as_provider(seed_providers.serve_group_state)
    spec = provider.spec()
    assert spec.kind == "callable" and spec.options["path"] == "seed_providers:serve_group_state"
    # in this process the object itself; in another (an unknown handle) the import by path
    assert provider_from_spec(spec) is provider
    elsewhere = provider_from_spec(ProviderSpec(kind="callable", options={
        "handle": "from-another-process", "path": spec.options["path"]}))
    assert isinstance(elsewhere, CallableProvider) and elsewhere.fn is seed_providers.serve_group_state


def test_an_unimportable_provider_on_a_worker_elsewhere_is_one_clear_error() -> None:
    spec = as_provider(lambda task: None).spec()
    assert "path" not in spec.options
    with pytest.raises(ConfigError, match="only exists in the process that started the batch"):
        provider_from_spec(ProviderSpec(kind="callable", options={"handle": "gone"}))
    with pytest.raises(ConfigError, match="cannot import provider 'no_such_module:f'"):
        provider_from_spec(ProviderSpec(kind="callable", options={"handle": "gone",
                                                                   "path": "no_such_module:f"}))


async def test_connect_takes_a_runtime_and_is_an_async_context_manager() -> None:
    """Seed 000: ``client = await stack.enter_async_context(connect(addr))``."""
    from durable_rollouts.client.envclient import connect

    env = load_environment(str(GROUP_STATE), fresh=True)
    async with serving(env) as server:
        async with connect(Runtime(server.url)) as client:
            assert client.connected and client.env.name == "group-state"
            manifest = client.manifest  # seed 002: the hello reply as a Manifest
            assert manifest.session_id == client.session_id and manifest.protocol_version
            assert manifest.server_info.name == "group-state" and manifest.bindings == []
        assert not client.connected  # the block closed it
        plain = await connect(server.url)  # the awaited form still works
        assert [t["id"] for t in await plain.list_tasks()] == ["probe"]
        await plain.close()
    with pytest.raises(ConfigError, match="takes a tcp:// url or a Runtime"):
        connect(42)


async def test_runtime_none_serves_rows_naming_an_env_an_imported_module_declares() -> None:
    """Seed 001: "rows naming envs declared in already-imported modules serve each env fresh
    from its declaring file" (rows from JSON carry no source)."""
    load_environment(str(ENVS / "letter_count.py"))  # the module is imported in this process
    rows = Taskset("json-rows", [{"env": "letter-count", "id": "count_letter",
                                  "args": {"word": "banana", "letter": "a"}}])
    assert rows[0].source is None
    job = await run_direct(rows, FixedAgent(answer="3"), group=2)
    assert [r.grade.reward for r in job.runs] == [1.0, 1.0]


def test_the_cli_runtime_specs_for_per_rollout_and_shared_local() -> None:
    from durable_rollouts.cli.specs import parse_runtime

    fresh, shared = parse_runtime(f"local:{GROUP_STATE}"), parse_runtime(f"local-shared:{GROUP_STATE}")
    assert not fresh.shared and shared.shared and shared.path == fresh.path == str(GROUP_STATE)
    assert shared.spec().options["shared"] is True and "shared" not in fresh.spec().options
