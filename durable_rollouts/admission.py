"""Fleet-wide admission of new substrates: a creation rate and a ceiling on live substrates.

Every runtime takes ``max_provisions_per_s`` and ``max_substrates``; together they are an
:class:`Admission`. They hold across every worker of a task queue because the engine holds
them, not a process: one ``RolloutsAdmission`` workflow per task queue and runtime kind
(``workflows.admission``) hands out tickets. A Rollout asks for one before it provisions (its
phase says ``waiting for admission`` meanwhile, outside its rollout timeout) and gives it back
after teardown. The rate counts provision starts as the server recorded them: a ticket counts
against the rate from its grant until ``window_s`` after its provision started, so no window of
``window_s`` seconds holds more than ``burst`` provision starts.

Pure pydantic: shared by the providers, the starters, the workflows and the activities.
"""

from __future__ import annotations

import math

from pydantic import Field

from durable_rollouts.errors import ConfigError
from durable_rollouts.models import StrictModel
from durable_rollouts.settings import settings

__all__ = ["Admission", "AdmissionTicket", "AdmitRequest", "ProvisionStarted", "admission_of",
           "admission_workflow_id"]

ADMISSION_WORKFLOW = "RolloutsAdmission"
SIG_ACQUIRE = "acquire"
SIG_STARTED = "provision_started"
SIG_RELEASE = "release"
SIG_ADMITTED = "admitted"  # sent to the Rollout that asked: its ticket is granted


class Admission(StrictModel):
    """A runtime's admission limits (None: unlimited)."""

    max_provisions_per_s: float | None = Field(default=None, gt=0)
    max_substrates: int | None = Field(default=None, ge=1)
    sweep_s: float = Field(default=60.0, gt=0)  # while requests wait on the ceiling: look for closed holders

    @property
    def burst(self) -> int:
        """How many provisions may start within one ``window_s``."""
        rate = self.max_provisions_per_s
        return max(1, math.floor(rate)) if rate else 0

    @property
    def window_s(self) -> float:
        """The sliding window the rate is held over: ``burst / rate`` seconds (1 s for whole rates)."""
        rate = self.max_provisions_per_s
        return self.burst / rate if rate else 0.0


def admission_of(max_provisions_per_s: float | None, max_substrates: int | None) -> Admission | None:
    """A runtime's two options as an Admission, or None when neither is set.

    Raises:
        ConfigError: a rate that is not a positive number, or a ceiling below 1.
    """
    if max_provisions_per_s is None and max_substrates is None:
        return None
    if max_provisions_per_s is not None and (
            isinstance(max_provisions_per_s, bool) or not isinstance(max_provisions_per_s, int | float)
            or not max_provisions_per_s > 0 or math.isinf(max_provisions_per_s)):
        raise ConfigError(f"max_provisions_per_s={max_provisions_per_s!r}: use a number above 0")
    if max_substrates is not None and (
            isinstance(max_substrates, bool) or not isinstance(max_substrates, int) or max_substrates < 1):
        raise ConfigError(f"max_substrates={max_substrates!r}: use a whole number of at least 1")
    return Admission(max_provisions_per_s=max_provisions_per_s, max_substrates=max_substrates,
                     sweep_s=settings().admission_sweep)


def admission_workflow_id(task_queue: str, kind: str) -> str:
    """The one admission workflow of a task queue and runtime kind."""
    return f"rollouts-admission-{task_queue}-{kind}"


class AdmitRequest(StrictModel):
    """A Rollout attempt asks for a ticket (``acquire``)."""

    ticket: str  # <rollout workflow id>#<attempt>
    holder: str  # the Rollout's workflow id: ``admitted`` goes there
    limits: Admission  # the newest request's limits are the workflow's limits


class AdmissionTicket(StrictModel):
    """What the provision step needs to report its start (``ProvisionInput.admission``)."""

    workflow_id: str
    ticket: str
    task_queue: str


class ProvisionStarted(StrictModel):
    """A provision attempt of ``ticket`` started at ``at`` (server time, epoch seconds)."""

    ticket: str
    at: float
