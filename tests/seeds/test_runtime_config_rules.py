"""Seed 002's ``RuntimeConfig`` (its "RuntimeConfig" section, around line 944), with ``hud``
renamed: set on the runtime (``runtime_config=``) or per row, merged by the runtime;
``DockerRuntime``, ``ModalRuntime`` and ``DaytonaRuntime`` accept it, ``LocalRuntime`` and
``HUDRuntime`` reject a per-task one, before anything starts.

Where the seed says a runtime *ignores* a field, ours honours it or refuses it (DESIGN: "a
provider rejects fields it cannot honour"): Docker honours ``limits``; Daytona honours
``run_timeout_s`` and refuses a resource override its snapshot was not built with
(``tests/providers/test_daytona.py``); ``LocalRuntime`` honours a row's
``limits.startup_timeout_s``. README "Coming from HUD" lists these.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_rollouts.agents import FixedAgent
from durable_rollouts.errors import ConfigError
from durable_rollouts.eval import (
    DaytonaRuntime,
    DockerRuntime,
    HUDRuntime,
    LocalRuntime,
    ModalRuntime,
    RuntimeConfig,
    RuntimeGPU,
    RuntimeLimits,
    RuntimeResources,
    Task,
    Taskset,
)
from durable_rollouts.runtimes.base import merge_config
from durable_rollouts.sdk.direct import run_direct

LETTER_COUNT = Path(__file__).parent / "envs" / "letter_count.py"

# the seed's example, as written
SEED_CONFIG = RuntimeConfig(
    image="my-env",
    resources=RuntimeResources(cpu=4, memory_mb=8192, gpu=RuntimeGPU(type="A100", count=1)),
    limits=RuntimeLimits(startup_timeout_s=300, run_timeout_s=1800),
)


def row(config: RuntimeConfig | None) -> Task:
    task = Taskset.from_file(LETTER_COUNT)[0]
    return task.model_copy(update={"runtime_config": config})


def untyped(config: RuntimeConfig) -> RuntimeConfig:
    """``config`` asking for a GPU count without a type (Docker and Daytona take no type)."""
    return config.model_copy(update={"resources": config.resources.model_copy(
        update={"gpu": RuntimeGPU(count=config.resources.gpu.count)})})


def test_container_runtimes_accept_it_on_the_runtime_and_per_row() -> None:
    ModalRuntime("my-env", runtime_config=SEED_CONFIG).check_task(row(SEED_CONFIG))
    for runtime in (DockerRuntime("my-env", runtime_config=untyped(SEED_CONFIG)),
                    DaytonaRuntime("my-snapshot", runtime_config=untyped(SEED_CONFIG))):
        runtime.check_task(row(untyped(SEED_CONFIG)))
        with pytest.raises(ConfigError, match=r"cannot honour runtime_config field\(s\) resources.gpu.type"):
            runtime.check_task(row(SEED_CONFIG))  # one GPU type is Modal's only
    # the runtime merges the two: the row's set fields over the runtime's
    merged = merge_config(SEED_CONFIG, RuntimeConfig(image="other-env", limits=RuntimeLimits(run_timeout_s=60)))
    assert (merged.image, merged.resources.cpu, merged.limits.startup_timeout_s, merged.limits.run_timeout_s) == (
        "other-env", 4, 300, 60)


async def test_local_and_hud_runtimes_reject_a_per_task_runtime_config() -> None:
    with pytest.raises(ConfigError, match=r"LocalRuntime cannot honour runtime_config field\(s\) image, "
                                          r"limits.run_timeout_s, resources.cpu"):
        await run_direct(Taskset("rows", [row(SEED_CONFIG)]), FixedAgent(answer="3"), LocalRuntime(LETTER_COUNT))
    with pytest.raises(ConfigError, match=r"LocalRuntime cannot honour runtime_config field\(s\) image"):
        await run_direct(Taskset("rows", [row(SEED_CONFIG)]), FixedAgent(answer="3"))  # default placement
    with pytest.raises(ConfigError, match=r"HUDRuntime cannot honour .*limits.startup_timeout_s"):
        # the durable path refuses it before connecting to Temporal (no server here)
        await Taskset("rows", [row(RuntimeConfig(limits=RuntimeLimits(startup_timeout_s=30)))]).run(
            FixedAgent(answer="3"), runtime=HUDRuntime(), temporal="127.0.0.1:1")
    # ours: LocalRuntime honours a row's startup limit (HUD's refuses it)
    job = await run_direct(Taskset("rows", [row(RuntimeConfig(limits=RuntimeLimits(startup_timeout_s=30)))]),
                           FixedAgent(answer="3"), LocalRuntime(LETTER_COUNT))
    assert job.runs[0].grade.reward == 1.0
