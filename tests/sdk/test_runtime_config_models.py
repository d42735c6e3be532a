"""RuntimeGPU / RuntimeResources / RuntimeLimits as the seeds write them, old ``gpu: int`` rows,
and providers that honour or reject each field with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from durable_rollouts import (
    LocalRuntime,
    RuntimeConfig,
    RuntimeGPU,
    RuntimeLimits,
    RuntimeResources,
    SubprocessRuntime,
    Task,
    Taskset,
)
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Limits, Resources
from durable_rollouts.runtimes.base import merge_config
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.runtimes.modal import ModalRuntime
from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.run import Run

SEED = RuntimeConfig(
    image="registry.example/env:1",
    resources=RuntimeResources(cpu=4, memory_mb=8192, gpu=RuntimeGPU(type="A100", count=1)),
    limits=RuntimeLimits(startup_timeout_s=300, run_timeout_s=1800),
)


class Three(Agent):
    async def __call__(self, run: Run) -> None:
        run.trace.content = "3"


def test_the_seeds_runtime_config_dumps_in_hud_shape_and_reads_back() -> None:
    dumped = SEED.model_dump(mode="json", exclude_none=True)
    assert dumped == {
        "image": "registry.example/env:1",
        "resources": {"cpu": 4.0, "memory_mb": 8192, "gpu": {"type": "A100", "count": 1}},
        "limits": {"startup_timeout_s": 300.0, "run_timeout_s": 1800.0},
    }
    assert RuntimeConfig.model_validate(json.loads(json.dumps(dumped))) == SEED
    assert RuntimeGPU().count == 1 and RuntimeGPU().types == []
    assert RuntimeGPU(type=["H100", "A100"]).types == ["H100", "A100"]


def test_the_former_names_are_the_same_models() -> None:
    assert Resources is RuntimeResources and Limits is RuntimeLimits


def test_a_plain_gpu_count_in_old_rows_means_that_many_gpus_of_any_type(tmp_path: Path) -> None:
    assert RuntimeResources.model_validate({"gpu": 2}).gpu == RuntimeGPU(count=2)
    assert RuntimeResources.model_validate({"gpu": 0}).gpu is None
    assert RuntimeResources.model_validate({"gpu": None}).gpu is None
    rows = tmp_path / "old.jsonl"
    rows.write_text(json.dumps({"env": "letters", "id": "count_letter",
                                "runtime_config": {"resources": {"cpu": 1, "gpu": 1}}}) + "\n")
    task = Taskset.from_file(rows)[0]
    assert task.runtime_config is not None
    assert task.runtime_config.resources.gpu == RuntimeGPU(count=1)


@pytest.mark.parametrize(("gpu", "message"), [
    (True, "not a bool"),
    (-1, "must be >= 0"),
    ({"count": 0}, "greater than or equal to 1"),
    ({"type": ""}, "gpu type must name a GPU type"),
    ({"type": []}, "gpu type must name a GPU type"),
    ({"type": "A100", "vendor": "x"}, "Extra inputs are not permitted"),
])
def test_a_bad_gpu_request_is_rejected_with_its_reason(gpu: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RuntimeResources.model_validate({"gpu": gpu})


def test_set_fields_names_the_gpu_type_only_when_one_is_asked_for() -> None:
    assert SEED.set_fields() == {"image", "resources.cpu", "resources.memory_mb", "resources.gpu",
                                 "resources.gpu.type", "limits.startup_timeout_s",
                                 "limits.run_timeout_s"}
    any_type = RuntimeConfig(resources=RuntimeResources(gpu=RuntimeGPU(count=2)))
    assert any_type.set_fields() == {"resources.gpu"}


def test_an_overriding_gpu_request_replaces_the_providers_whole() -> None:
    base = RuntimeConfig(resources=RuntimeResources(cpu=2, gpu=RuntimeGPU(type="T4", count=1)))
    row = RuntimeConfig(resources=RuntimeResources(gpu=RuntimeGPU(count=4)))
    merged = merge_config(base, row)
    assert merged.resources.cpu == 2 and merged.resources.gpu == RuntimeGPU(count=4)


def test_docker_honours_a_gpu_count_and_rejects_a_gpu_type() -> None:
    DockerRuntime("img", runtime_config=RuntimeConfig(resources=RuntimeResources(gpu=2)))
    with pytest.raises(ConfigError) as info:
        DockerRuntime("img", runtime_config=SEED)
    assert "cannot honour runtime_config field(s) resources.gpu.type" in str(info.value)


def test_modal_honours_one_gpu_type_and_rejects_a_choice_of_types() -> None:
    ModalRuntime("img", runtime_config=SEED)
    choice = RuntimeConfig(resources=RuntimeResources(gpu=RuntimeGPU(type=["H100", "A100"])))
    with pytest.raises(ConfigError, match=r"choice of GPU types \['H100', 'A100'\]"):
        ModalRuntime("img", runtime_config=choice)


async def test_a_local_runtime_rejects_a_gpu_row_before_anything_starts(letters_path: Path) -> None:
    row = Task(env="letters", id="count_letter",
               runtime_config=RuntimeConfig(resources=RuntimeResources(gpu=RuntimeGPU(count=1))))
    with pytest.raises(ConfigError) as info:
        await run_direct(Taskset("gpu", [row]), Three(), LocalRuntime(letters_path))
    assert "LocalRuntime cannot honour runtime_config field(s) resources.gpu of task" in str(info.value)


async def test_runtime_limits_reach_the_provider_that_honours_them(letters_path: Path) -> None:
    row = Task(env="letters", id="count_letter", args={"word": "strawberry", "letter": "r"},
               runtime_config=RuntimeConfig(limits=RuntimeLimits(startup_timeout_s=30)))
    job = await run_direct(Taskset("limits", [row]), Three(), SubprocessRuntime(letters_path))
    assert job.runs[0].reward == 1.0, job.runs[0].error
