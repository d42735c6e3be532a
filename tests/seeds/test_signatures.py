"""The seeds' signatures that behave as written: Environment(capabilities=), Capability called
with a name, Grade.from_dict, run.record(step) and run.prompt_messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durable_rollouts.capabilities import Capability
from durable_rollouts.environment import Environment
from durable_rollouts.eval import Grade, Run
from durable_rollouts.models import Step

LETTER_COUNT = Path(__file__).parent / "envs" / "letter_count.py"


def test_environment_publishes_the_capabilities_it_is_built_with() -> None:
    tools = Capability.mcp(name="tools", url="http://127.0.0.1:9/mcp")
    env = Environment(name="x", capabilities=[tools])
    assert env.capabilities == [tools] and env.capability("tools") is tools
    with pytest.raises(ValueError, match="has no url"):
        Environment(name="y", capabilities=[tools.model_copy(update={"url": ""})])


def test_a_capability_called_with_a_name_is_published_under_it() -> None:
    shell = Capability.mcp(name="tools", url="http://127.0.0.1:9/mcp")
    assert shell() is shell and shell("tools") is shell
    renamed = shell("other")
    assert renamed.name == "other" and renamed.url == shell.url and shell.name == "tools"


def test_grade_from_dict_reads_a_grade_frame() -> None:
    grade = Grade.from_dict({"score": 0.5, "info": {"k": 1}, "done": True})
    assert (grade.reward, grade.info, grade.done) == (0.5, {"k": 1}, True)
    with pytest.raises(ValueError, match="no numeric score"):
        Grade.from_dict({"score": True})


def test_run_record_and_prompt_messages() -> None:
    run = Run(prompt={"prompt": "How many r's?"})
    assert run.prompt_messages == [{"role": "user", "content": "How many r's?"}]
    chat = Run(prompt={"prompt": [{"role": "system", "content": "be brief"}, "hi"]})
    assert chat.prompt_messages == [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "hi"}]
    run.record(Step(source="agent", messages=[{"role": "assistant", "content": "3"}]))
    assert [s.source for s in run.trace.steps] == ["agent"]


async def test_env_serve_serves_until_cancelled(capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from durable_rollouts.client.envclient import connect

    env = Environment(name="served")

    @env.template()
    async def hi():
        answer = yield "hi"
        yield 1.0

    serving = asyncio.ensure_future(env.serve())
    for _ in range(100):
        await asyncio.sleep(0.05)
        if "ROLLOUTS_SERVE_PORT=" in (out := capsys.readouterr().out):
            break
    port = int(out.split("ROLLOUTS_SERVE_PORT=")[1].split()[0])
    async with connect(f"tcp://127.0.0.1:{port}") as client:
        assert [t["id"] for t in await client.list_tasks()] == ["hi"]
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert not env.started


class _ModalImage:
    """Stands for a ``modal.Image`` (Modal's cloud is a mock boundary here: the ``modal`` module is
    ``tests/providers/fake_modal``): ``object_id`` raises until the image is built, as Modal's."""

    def __init__(self) -> None:
        self.built_id: str | None = None

    @property
    def object_id(self) -> str:
        if self.built_id is None:
            raise AttributeError("Attempting to get object_id of unhydrated Image")
        return self.built_id


async def test_modal_runtime_takes_an_image_name_or_a_modal_image(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 002: ``ModalRuntime(image_name=None, *, image=None, app_name=..., ...)``."""
    from fake_modal import FakeModal

    from durable_rollouts import Taskset
    from durable_rollouts.errors import ConfigError
    from durable_rollouts.models import RuntimeConfig
    from durable_rollouts.runtimes import modal as modal_runtime
    from durable_rollouts.runtimes.modal import ModalRuntime
    from durable_rollouts.sdk.placement import check_remote_provider

    fake = FakeModal(tmp_path)
    monkeypatch.setitem(sys.modules, "modal", fake)
    # a published name: positional, image_name= (HUD) or image= (our earlier form)
    assert ModalRuntime("my-env", app_name="hud-envs").spec() == ModalRuntime(
        image_name="my-env", app_name="hud-envs").spec() == ModalRuntime(image="my-env", app_name="hud-envs").spec()
    # a modal.Image object: the sandbox is created with it
    image = _ModalImage()
    runtime = ModalRuntime(image=image, app_name="hud-envs", env_vars={"ROLLOUTS_ENV_FILE": str(LETTER_COUNT)})
    endpoint = await runtime.acquire(Taskset.from_file(LETTER_COUNT)[0], f"seed-modal-{tmp_path.name}")
    try:
        [(_, _, created)] = [c for c in fake.calls if c[0] == "Sandbox.create"]
        assert created["image"] is image and ("App.lookup", "hud-envs", True) in fake.calls
    finally:
        await runtime.release(endpoint)
        fake.shutdown()
    # ... it reaches workers in this process by handle; elsewhere only once built (by its id)
    spec = runtime.spec()
    assert ModalRuntime.from_options(spec.options)._image(fake, RuntimeConfig()) is image
    monkeypatch.delitem(modal_runtime._IMAGES, spec.options["image_handle"])  # as in another process
    with pytest.raises(ConfigError, match="exists only in the process that made the runtime"):
        ModalRuntime.from_options(spec.options)._image(fake, RuntimeConfig())
    with pytest.raises(ConfigError, match="exists only in the process that made the runtime"):
        check_remote_provider(spec)
    image.built_id = "im-123"
    built = ModalRuntime(image=image).spec()
    check_remote_provider(built)
    assert ModalRuntime.from_options({**built.options, "image_handle": "gone"})._image(
        fake, RuntimeConfig()) == ("image-id", "im-123")
    # a row's runtime_config.image still wins; a name and an object at once is refused
    assert runtime._image(fake, RuntimeConfig(image="row-env")) == ("image", "row-env")
    with pytest.raises(ConfigError, match="not both"):
        ModalRuntime("my-env", image=image)


def test_docker_runtime_takes_docker_run_arguments_as_hud_writes_them() -> None:
    from durable_rollouts.errors import ConfigError
    from durable_rollouts.runtimes.docker import DockerRuntime

    runtime = DockerRuntime("my-env", run_args=(
        "--shm-size=2g", "-e", "MODE=fast", "--cpus", "1.5", "-v", "/data:/data:ro",
        "--tmpfs", "/scratch:size=64m", "--read-only", "--sysctl", "net.core.somaxconn=1024"))
    assert runtime.run_args == {
        "shm_size": "2g", "nano_cpus": 1_500_000_000, "volumes": {"/data": {"bind": "/data", "mode": "ro"}},
        "tmpfs": {"/scratch": "size=64m"}, "read_only": True, "sysctls": {"net.core.somaxconn": "1024"}}
    assert runtime.env_vars == {"MODE": "fast"}
    assert DockerRuntime.from_options(runtime.spec().options).run_args == runtime.run_args
    with pytest.raises(ConfigError, match="may not set privileged"):
        DockerRuntime("my-env", run_args=("--privileged",))
    with pytest.raises(ConfigError, match=r"'--gpus' has no translation.*resources.gpu"):
        DockerRuntime("my-env", run_args=("--gpus", "all"))
    with pytest.raises(ConfigError, match="'--shm-size' needs a value"):
        DockerRuntime("my-env", run_args=("--shm-size",))


async def test_hello_returns_the_manifest_and_still_reads_as_the_reply() -> None:
    """Seed 000, ``HudClient.hello``: ``await client.hello()`` parses the reply into a
    ``Manifest`` (kept as ``client.manifest``); ``session_id`` resumes the session."""
    from durable_rollouts import Runtime
    from durable_rollouts.client import Manifest, connect
    from durable_rollouts.envserver import serving

    tools = Capability.mcp(name="tools", url="http://127.0.0.1:9/mcp")
    async with serving(Environment(name="manifested", version="1.2", capabilities=[tools])) as server, \
            connect(Runtime(f"tcp://127.0.0.1:{server.port}")) as client:
        first = client.manifest
        assert isinstance(first, Manifest) and first.server_info.name == "manifested"
        assert [(b.name, b.protocol, b.url) for b in first.bindings] == [
            ("tools", tools.protocol, "http://127.0.0.1:9/mcp")]
        manifest = await client.hello(first.session_id)
        assert isinstance(manifest, Manifest) and client.manifest is manifest
        assert manifest == first and manifest.protocol_version == first["protocol"]
        # today's form: the reply as a dict
        assert manifest["session_id"] == manifest.session_id and "bindings" in manifest
        assert manifest.get("env") == {"name": "manifested", "version": "1.2"}
        assert manifest.get("absent", 7) == 7
