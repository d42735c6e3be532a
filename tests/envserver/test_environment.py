"""Environment authoring: templates, Task rows, argument coercion, grades, hooks, loading."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from envserver_helpers import make_env
from pydantic import BaseModel

from durable_rollouts.envserver import (
    Answer,
    Capability,
    Environment,
    load_environment,
    normalize_grade,
)
from durable_rollouts.errors import ConfigError, EnvError, TaskNotFoundError


def test_template_rejects_plain_coroutines_and_duplicate_ids() -> None:
    env = Environment()
    with pytest.raises(TypeError):

        @env.template()
        async def not_a_generator():  # noqa: ANN202
            return 1

    @env.template(id="same")
    async def one():
        yield "p"

    with pytest.raises(ValueError, match="duplicate"):

        @env.template(id="same")
        async def two():
            yield "p"


def test_calling_a_template_returns_a_task_row_with_defaults_bound_and_this_file_as_source() -> None:
    env = make_env()
    task = env.templates["count"](word="cherry")
    assert task.env == "testenv" and task.id == "count"
    assert task.args == {"word": "cherry", "letter": "a"}
    assert task.source == str(Path(__file__).parent.joinpath("envserver_helpers.py").resolve())
    assert task.slug.startswith("count-")


def test_string_arguments_are_coerced_to_their_annotations() -> None:
    tpl = make_env().templates["typed"]
    assert tpl.bind_arguments({"n": "3", "items": "[1, 2]", "flag": "true"}) == {
        "n": 3,
        "items": [1, 2],
        "flag": True,
    }


@pytest.mark.parametrize(
    "args",
    [{"n": "three"}, {"n": 1, "bogus": 2}, {}],
    ids=["bad-type", "unknown-name", "missing-required"],
)
def test_bad_arguments_raise_config_error(args: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make_env().templates["typed"].bind_arguments(args)


def test_kwargs_templates_accept_any_argument_name_and_say_so_in_the_schema() -> None:
    env = make_env()
    assert env.templates["kw"].bind_arguments({"anything": 1}) == {"anything": 1}
    assert env.templates["kw"].manifest()["args"]["additionalProperties"] is True
    assert env.templates["count"].manifest()["args"]["additionalProperties"] is False


def test_manifest_lists_required_args_defaults_and_returns_schema() -> None:
    env = Environment()

    @env.template(description="d", returns=int)
    async def t(n: int, word: str = "x"):
        yield "p"

    entry = t.manifest()
    assert entry["id"] == "t" and entry["description"] == "d"
    assert entry["args"]["required"] == ["n"]
    assert entry["args"]["properties"]["word"]["default"] == "x"
    assert entry["args"]["properties"]["n"]["type"] == "integer"
    assert entry["returns"] == {"type": "integer"}
    assert "returns" not in make_env().templates["count"].manifest()  # HUD's shape: only when declared


def test_returns_wraps_the_answer_parsed_or_raw_when_parsing_fails() -> None:
    env = Environment()

    @env.template(returns=list[int])
    async def t():
        yield "p"

    parsed = t.wrap_answer("[1, 2]")
    assert isinstance(parsed, Answer) and parsed.content == [1, 2] and parsed.raw == "[1, 2]"
    unparsed = t.wrap_answer("not a list")
    assert unparsed.content == "not a list" and unparsed.raw == "not a list"


class _Eval(BaseModel):
    reward: float
    done: bool = True
    content: str = "ok"


@dataclasses.dataclass
class _DataEval:
    reward: float
    info: dict


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, {"score": 1.0}),
        (0.25, {"score": 0.25}),
        ({"score": 1, "subscores": [{"name": "a"}], "k": "v"}, {"score": 1.0, "subscores": [{"name": "a"}], "k": "v"}),
        (_Eval(reward=0.5), {"score": 0.5, "done": True, "content": "ok"}),
        (_DataEval(reward=1.0, info={"x": 1}), {"score": 1.0, "info": {"x": 1}}),
    ],
)
def test_grades_normalise_to_score_frames(value: object, expected: dict[str, object]) -> None:
    assert normalize_grade(value) == expected


@pytest.mark.parametrize("value", [True, "1.0", None, {"score": "1"}, {"score": True}, {"no": 1}, float("nan")])
def test_non_numeric_grades_are_rejected(value: object) -> None:
    with pytest.raises(TypeError):
        normalize_grade(value)


async def test_hooks_run_once_in_order_and_shutdown_in_reverse() -> None:
    env = Environment()
    calls: list[str] = []
    env.initialize(lambda: calls.append("init1"))

    @env.initialize
    async def init2() -> None:
        calls.append("init2")

    env.shutdown(lambda: calls.append("down1"))

    @env.shutdown
    async def down2() -> None:
        calls.append("down2")
        raise RuntimeError("best effort")

    await env.start()
    await env.start()
    await env.stop()
    assert calls == ["init1", "init2", "down2", "down1"]


async def test_a_failing_initialize_hook_raises_env_error_naming_the_hook() -> None:
    env = Environment()

    @env.initialize
    async def broken_hook() -> None:
        raise OSError("disk full")

    with pytest.raises(EnvError, match="broken_hook"):
        await env.start()
    assert not env.started


def test_capabilities_are_replaced_by_name_and_need_a_url() -> None:
    env = Environment()
    env.add_capability(Capability(name="db", protocol="tcp/1", url="tcp://127.0.0.1:1"))
    env.add_capability(Capability(name="db", protocol="tcp/1", url="tcp://127.0.0.1:2"))
    assert [c.url for c in env.capabilities] == ["tcp://127.0.0.1:2"]
    assert env.capability("db").manifest() == {"name": "db", "protocol": "tcp/1", "url": "tcp://127.0.0.1:2", "params": {}}
    with pytest.raises(KeyError):
        env.capability("missing")
    with pytest.raises(ValueError):
        env.add_capability(Capability(name="x", protocol="tcp/1", url=""))


def test_unknown_task_ids_raise_task_not_found() -> None:
    with pytest.raises(TaskNotFoundError, match="nope"):
        make_env().get_template("nope")


def test_load_environment_from_a_file_picks_the_env_and_sets_source(tmp_path: Path) -> None:
    path = tmp_path / "myenv.py"
    path.write_text(
        "from durable_rollouts.envserver import Environment\n"
        "a = Environment(name='alpha')\n"
        "b = Environment(name='beta')\n"
    )
    assert load_environment(str(path), name="beta").name == "beta"
    assert load_environment(str(path), name="a").source == str(path.resolve())
    with pytest.raises(ConfigError, match="several"):
        load_environment(str(path))
    with pytest.raises(ConfigError):
        load_environment(str(tmp_path / "missing.py"))


def test_load_environment_from_a_module_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "modenv_for_test.py").write_text(
        "from durable_rollouts.envserver import Environment\nmy_env = Environment(name='gamma')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_environment("modenv_for_test:my_env").name == "gamma"
    assert load_environment("modenv_for_test").name == "gamma"
    with pytest.raises(ConfigError):
        load_environment("no_such_module_xyz:env")
    with pytest.raises(ConfigError, match="not an Environment"):
        load_environment("durable_rollouts.protocol:Method")


def test_template_also_works_as_a_bare_decorator_and_uses_the_docstring() -> None:
    env = Environment()

    @env.template
    async def plain(x: int = 1):
        """Say x."""
        yield str(x)

    assert env.templates["plain"] is plain
    assert plain.manifest()["description"] == "Say x."
    assert plain(x=2).args == {"x": 2}
