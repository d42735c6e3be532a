"""Class paths saved by earlier releases (before runtimes/, steps/, client/, stores/) still load."""

from __future__ import annotations

import importlib

import pytest

from durable_rollouts import moved
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import ProviderSpec
from durable_rollouts.runtimes import LocalRuntime, SubprocessRuntime, provider_from_spec


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_every_moved_module_has_a_home_that_imports(old: str) -> None:
    module = moved.import_module(old)
    assert module.__name__ == moved.MOVED[old]
    with pytest.raises(ModuleNotFoundError):  # the old path itself is gone: no shim modules
        importlib.import_module(old)


def test_a_provider_spec_of_the_last_release_rebuilds_its_runtime() -> None:
    local = provider_from_spec(ProviderSpec(kind="durable_rollouts.sdk.providers.local:LocalRuntime",
                                            options=LocalRuntime("examples/letters/env.py").spec().options))
    assert isinstance(local, LocalRuntime)
    sub = provider_from_spec(ProviderSpec(kind="durable_rollouts.sdk.providers.subprocess:SubprocessRuntime",
                                          options=SubprocessRuntime("examples/letters/env.py").spec().options))
    assert isinstance(sub, SubprocessRuntime)


def test_a_path_that_never_existed_is_still_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="cannot load provider"):
        provider_from_spec(ProviderSpec(kind="durable_rollouts.sdk.nowhere:Thing"))


def test_longest_prefix_wins_and_other_paths_are_untouched() -> None:
    assert moved.current("durable_rollouts.sdk.providers.docker") == "durable_rollouts.runtimes.docker"
    assert moved.current("durable_rollouts.sdk.agents") == "durable_rollouts.sdk.agents"
    assert moved.current("my_pkg.sdk.providers") == "my_pkg.sdk.providers"
