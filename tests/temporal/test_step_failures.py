"""The activity edge of the merged steps: a failed part travels as an ApplicationError that keeps
its type and retryability and names its phase, and the workflow side reads the phase back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError

from durable_rollouts.activities.failures import CONFIG_ERROR, SUBSTRATE_GONE, map_step_errors
from durable_rollouts.errors import ConfigError, ModelAPIError, StepFailed, SubstrateGoneError
from durable_rollouts.workflows.failures import failed_phase


def _raised(cause: BaseException, phase: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught, map_step_errors():
        raise StepFailed(phase, cause)
    return caught.value


def test_each_kind_of_failure_keeps_its_type_retryability_and_phase() -> None:
    gone = _raised(SubstrateGoneError("refused"), "connecting")
    assert (gone.type, gone.non_retryable, failed_phase(gone, "provisioning")) == (SUBSTRATE_GONE, True, "connecting")
    bad = _raised(ConfigError("no such task"), "starting task")
    assert (bad.type, bad.non_retryable, failed_phase(bad, "x")) == (CONFIG_ERROR, True, "starting task")
    busy = _raised(ModelAPIError("slow down", retryable=True, status=429, retry_after_s=2.0), "starting task")
    assert busy.next_retry_delay == timedelta(seconds=2) and busy.details[0] == {"status": 429}
    infra = _raised(OSError("disk"), "provisioning")
    assert (infra.type, infra.non_retryable, failed_phase(infra, "x")) == ("OSError", False, "provisioning")


def test_a_failure_without_a_phase_keeps_the_workflows_own() -> None:
    assert failed_phase(ApplicationError("x", {"status": 500}, type="ModelAPIError"), "agent loop") == "agent loop"
    assert failed_phase(RuntimeError("x"), "grading") == "grading"
