"""Inputs, outputs and names shared by the workflows, the activities and the starters.

Pure pydantic plus ``durable_rollouts.models``: safe inside the workflow sandbox. Activity
*names* live here so workflows reference activities by string and never import their modules.
Must not import envserver, sdk, activities or anything with I/O.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from durable_rollouts.admission import Admission
from durable_rollouts.models import (
    ERROR_STATUSES,
    RETRYABLE_STATUSES,
    AgentSpec,
    ProviderSpec,
    ResultsRef,
    RetryAttempt,
    RolloutResult,
    StrictModel,
    Task,
)
from durable_rollouts.steps.plan import AGENT_HEARTBEAT_S
from durable_rollouts.workflows.stream import PolicyRef, StreamOptions, StreamState

__all__ = [
    "ACT_ADMIT",
    "ACT_AGENTS_ON",
    "ACT_AGENT",
    "ACT_AWAIT_ROLLOUTS",
    "ACT_CLOSED_HOLDERS",
    "ACT_CONNECT",
    "ACT_GRADE",
    "ACT_CLOSE",
    "ACT_EXTEND_ROWS",
    "ACT_LOAD_ROWS",
    "ACT_OPEN",
    "ACT_PROVISION",
    "ACT_QUEUE_ALIVE",
    "ACT_RESOLVE",
    "ACT_START",
    "ACT_STORE_RESULTS",
    "ACT_TEARDOWN",
    "ACT_VERIFY",
    "ACT_VERIFY_CLOSE",
    "ACT_VERIFY_OPEN",
    "ACT_WORKER_ALIVE",
    "AGENT_HEARTBEAT_S",
    "DEFAULT_TASK_QUEUE",
    "QUEUE_TIMEOUT_S",
    "ERR_CONFIG",
    "ERR_SUBSTRATE_GONE",
    "ERROR_STATUSES",
    "ON_ERROR_POLICIES",
    "OnError",
    "PartDone",
    "PartResults",
    "PartRun",
    "RETRYABLE_STATUSES",
    "CARD_LAYOUT",
    "MAX_CONCURRENT",
    "NON_RETRYABLE",
    "AddRows",
    "AddedRows",
    "AwaitRolloutsInput",
    "AwaitedRollout",
    "CarriedRollout",
    "ExtendRowsInput",
    "LoadRowsInput",
    "Progress",
    "ResolveGroupInput",
    "ResultsRef",
    "RolloutInput",
    "SEARCH_ATTRIBUTES",
    "SIG_AGENT_WORKER_LOST",
    "StoreResultsInput",
    "TasksetRunInput",
    "TasksetRunResult",
    "UPD_CHECKPOINT",
    "UPD_LATEST_CHECKPOINT",
]

DEFAULT_TASK_QUEUE = "rollouts"
QUEUE_TIMEOUT_S = 30.0
"""How long a step waits on a substrate's own queue before its worker counts as gone."""
MAX_CONCURRENT = 100_000
"""The most rollouts one batch keeps in flight: wider than ``children_per_workflow``, the batch
runs as parts (``workflows.fan_out``), each a child TasksetRun under Temporal's per-workflow limits."""

# Activity names (the activities register under exactly these).
ACT_RESOLVE = "rollouts.resolve_group"
ACT_STORE_RESULTS = "rollouts.store_results"
ACT_LOAD_ROWS = "rollouts.load_rows"
ACT_EXTEND_ROWS = "rollouts.extend_rows"
ACT_AWAIT_ROLLOUTS = "rollouts.await_rollouts"
ACT_PROVISION = "rollouts.provision"
ACT_CONNECT = "rollouts.connect"
ACT_START = "rollouts.start"
ACT_AGENT = "rollouts.agent"
# Updates of the Rollout workflow that the agent activity sends (durable agent turns).
UPD_CHECKPOINT = "checkpoint"
UPD_LATEST_CHECKPOINT = "latest_checkpoint"
ACT_GRADE = "rollouts.grade"
ACT_VERIFY = "rollouts.verify"
ACT_VERIFY_OPEN = "rollouts.verify_open"
ACT_VERIFY_CLOSE = "rollouts.verify_close"
ACT_TEARDOWN = "rollouts.teardown"
# Answered by a worker's liveness queue (workflows.queue_probe): a busy queue is not a lost one.
ACT_QUEUE_ALIVE = "rollouts.queue_alive"
ACT_WORKER_ALIVE = "rollouts.worker_alive"
ACT_AGENTS_ON = "rollouts.agents_on"  # which of a dead worker's agent steps are still on it  # a worker process's liveness sentinel (workflows.worker_watch)
SIG_AGENT_WORKER_LOST = "agent_worker_lost"  # to a Rollout: the worker of its agent step died
# Fleet-wide admission (``workflows.admission``): ask for a ticket; find holders that closed.
ACT_ADMIT = "rollouts.admit"
ACT_CLOSED_HOLDERS = "rollouts.admission_closed_holders"
# Merged steps for fast local substrates (patch "merged-local-steps"): provision -> connect ->
# start as one, and grade -> teardown as one where the substrate dies with its worker.
ACT_OPEN = "rollouts.open"
ACT_CLOSE = "rollouts.grade_teardown"

# ApplicationError types the activities raise (activities.failures) and the workflows react to.
ERR_CONFIG = "ConfigError"  # a user mistake: never retried
ERR_SUBSTRATE_GONE = "SubstrateGone"  # the substrate is gone: the Rollout workflow reprovisions
NON_RETRYABLE = [ERR_CONFIG, ERR_SUBSTRATE_GONE]

# Search attributes registered on the embedded dev server (name -> Temporal type). Batches carry
# JobId/JobName/Taskset/Agent/Status; every Rollout carries JobId, TaskSlug, Status, Reward and
# ErrorPhase.
SEARCH_ATTRIBUTES = {
    "RolloutsJobId": "Keyword",
    "RolloutsJobName": "Keyword",
    "RolloutsTaskset": "Keyword",
    "RolloutsAgent": "Keyword",
    "RolloutsTaskSlug": "Keyword",
    "RolloutsStatus": "Keyword",
    "RolloutsReward": "Double",
    "RolloutsErrorPhase": "Keyword",
}

OnError = Literal["keep", "drop_group", "fail", "drop_sample"]
"""What a batch does about a rollout whose error survived its retries (``TasksetRunInput.on_error``)."""
ON_ERROR_POLICIES: tuple[str, ...] = ("keep", "drop_group", "fail", "drop_sample")



_Model = StrictModel  # the one strict base of boundary models (models.py)


class Progress(_Model):
    """Live counters of a TasksetRun (the ``progress`` query and the Web UI details)."""

    job_id: str
    batch_index: int = 0
    total: int = 0
    started: int = 0
    running: int = 0
    # A batch run as parts: the parts still running (their own ``progress`` adds to this one's).
    parts: list[str] = Field(default_factory=list)
    succeeded: int = 0
    failed: int = 0
    errored: int = 0
    timeout: int = 0
    cancelled: int = 0
    reward_sum: float = 0.0
    graded: int = 0
    runs: int = 1  # workflow runs so far (1 + continue-as-new count)
    done: bool = False

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.errored + self.timeout + self.cancelled

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.graded if self.graded else None

    def count(self, result: RolloutResult) -> None:
        # Only a succeeded rollout's reward is a reward (an errored one's grade is best effort).
        # Runs inside the workflow, but only feeds the query and the current details: replay-safe.
        setattr(self, result.status, getattr(self, result.status) + 1)
        if result.status == "succeeded" and result.reward is not None:
            self.reward_sum += result.reward
            self.graded += 1


class CarriedRollout(_Model):
    """A rollout still running when its batch's run continued as new: the next run awaits it
    (``ACT_AWAIT_ROLLOUTS``) instead of the run draining first."""

    workflow_id: str  # its Rollout child (``child_id(rollout_id, retry)``)
    rollout_id: str
    group_id: str
    slug: str
    row_index: int
    group_index: int
    retry: int = 0
    earlier: list[RetryAttempt] = Field(default_factory=list)
    task: Task | None = None  # kept only when a fresh re-run may follow (``retries``)


class AwaitRolloutsInput(_Model):
    workflow_ids: list[str]
    linger_s: float = Field(default=0.5, ge=0)  # after the first closes, gather those closing with it


class AwaitedRollout(_Model):
    """How a carried Rollout ended: its result, or why it has none (cancelled, failed, gone)."""

    workflow_id: str
    result: RolloutResult | None = None
    cancelled: bool = False
    error: str | None = None


class TasksetRunInput(_Model):
    """One batch of a job: rows x group rollouts. Also the continue-as-new carrier."""

    job_id: str
    job_name: str = ""
    batch_index: int = 0
    taskset_name: str = ""
    taskset_class: str | None = None  # `module:Class` when resolve_task is overridden
    rows: list[Task] = Field(default_factory=list)
    # Large tasksets travel by claim check: a JSONL file of rows, loaded in windows by activity.
    rows_ref: str | None = None
    total_rows: int | None = None
    # epochs=None: the paged rows again and again (total_rows is a bound) until the stream closes
    open_ended: bool = False
    # Resume: run only these (row_index, group_index) slots, sorted (stable rollout ids keep).
    only: list[tuple[int, int]] | None = None
    group: int = Field(default=1, ge=1)
    max_concurrent: int = Field(default=16, ge=1, le=MAX_CONCURRENT)
    agent: AgentSpec
    provider: ProviderSpec
    rollout_timeout_s: float | None = None
    max_attempts: int = Field(default=3, ge=1)
    # Wider than this (``max_concurrent`` and the rollouts left), the batch runs as parts: child
    # TasksetRuns over disjoint slices (``workflows.fan_out``); None in histories from before.
    children_per_workflow: int | None = Field(default=None, ge=1)
    part: int | None = None  # this run is part ``part`` of its batch (its parent is the batch)
    # A part of a streamed batch (``workflows.stream_parts``): the batch's workflow id, which it
    # signals each finished rollout to, and the groups it may start (grants; None: no limit).
    forward_to: str | None = None
    credits: int | None = Field(default=None, ge=0)
    stop_index: int | None = None  # a part's slots end here (the batch's total when None)
    # Batch policy: fresh re-runs of an errored/timed-out rollout, then what an error left means.
    retries: int = Field(default=0, ge=0, le=20)
    on_error: OnError = "keep"
    local_steps: bool = True  # fast local substrate: provision/teardown as local activities too
    # A substrate's own (host or process) queue unpolled this long: its worker is gone.
    queue_timeout_s: float = Field(default=QUEUE_TIMEOUT_S, gt=0)
    agent_heartbeat_s: float = Field(default=AGENT_HEARTBEAT_S, gt=0)  # as ``RolloutInput``'s
    worker_watch: bool = False  # as ``RolloutInput``'s
    # The substrate lives in the worker process that opens it and dies with it (``LocalRuntime``):
    # in layout 4 its whole rollout is one agent step.
    ephemeral: bool = False
    task_queue: str = DEFAULT_TASK_QUEUE
    search_attributes: bool = True
    # continue-as-new once history passes this many events (or the server suggests it);
    # then results above ``flush_results_over`` go to the result store as claim checks
    max_history_events: int = Field(default=8_000, ge=20)
    flush_results_over: int = Field(default=200, ge=0)
    # continue-as-new carry
    next_index: int = 0
    resolved: dict[int, Task] = Field(default_factory=dict)
    results: list[RolloutResult] = Field(default_factory=list)
    result_refs: list[ResultsRef] = Field(default_factory=list)
    progress: Progress | None = None
    # A streamed batch (``Taskset.start``): its pacing, and the stream carried across runs.
    stream: StreamOptions | None = None
    stream_state: StreamState | None = None
    policy: PolicyRef | None = None  # the policy new rollouts sample with (carried)
    # Rows added to a streamed batch while it ran (``LiveJob.add``): their ids, taken once each.
    added: list[str] = Field(default_factory=list)
    # The runtime's fleet-wide admission limits (None: provision as fast as slots allow).
    admission: Admission | None = None
    # Rollouts the previous run left running (it continued as new without draining them).
    carried: list[CarriedRollout] = Field(default_factory=list)
    # A streamed batch run as parts: the parts not yet merged (carried across continue-as-new).
    parts: list[PartRun] = Field(default_factory=list)


class TasksetRunResult(_Model):
    job_id: str
    job_name: str = ""
    batch_index: int = 0
    on_error: OnError = "keep"
    failed_on: str | None = None  # on_error="fail": the rollout whose error stopped the batch
    progress: Progress
    results: list[RolloutResult] = Field(default_factory=list)
    result_refs: list[ResultsRef] = Field(default_factory=list)


# The shape of the Rollouts a parent of this release starts (``RolloutInput.layout``): the card's
# steps (``workflows.rollout``). Lower values are earlier releases' shapes (``workflows.legacy``).
CARD_LAYOUT = 5


class PartRun(_Model):
    """A part of a streamed batch, as the batch tracks it (``workflows.stream_parts``)."""

    part: int
    workflow_id: str
    groups: int  # the groups of its slice
    granted: int | None = None  # groups it may start so far (max_in_flight); None: no limit
    finished: int = 0  # its groups the batch's stream finished
    policy_version: int | None = None  # the policy version it was last sent
    done: TasksetRunResult | None = None  # its result, once it reported it


class PartResults(_Model):
    """Rollouts a part of a streamed batch finished (signal ``part_results``, to the batch)."""

    part: int
    results: list[RolloutResult]


class PartDone(_Model):
    """A part of a streamed batch closed (signal ``part_done``, to the batch)."""

    part: int
    result: TasksetRunResult


class RolloutInput(_Model):
    """One rollout of ``task``: the input of a ``Rollout`` child (recorded in its start event).

    ``rollout_id`` is the rollout's stable id (also in a fresh re-run, whose workflow id ends in
    ``-r<retry>``); in layouts below ``CARD_LAYOUT`` it was the workflow id.
    """

    rollout_id: str
    job_id: str
    group_id: str
    group_index: int
    row_index: int
    task: Task
    agent: AgentSpec
    provider: ProviderSpec
    rollout_timeout_s: float | None = None
    max_attempts: int = Field(default=3, ge=1)
    local_steps: bool = False
    ephemeral: bool = False  # as ``TasksetRunInput.ephemeral``
    task_queue: str = DEFAULT_TASK_QUEUE  # the queue this workflow runs on (replay-safe)
    # Upsert RolloutsStatus/Reward/ErrorPhase (the parent knows they are registered); False in
    # every history recorded before these attributes existed.
    search_attributes: bool = False
    # The parent set RolloutsStatus=running when it started this child: no upsert of it here.
    status_at_start: bool = False
    retry: int = 0  # fresh re-runs before this one (the child id then ends in -r<retry>)
    # How long a step may wait on the substrate's own (host or process) queue before that
    # worker, and the substrate with it, count as gone (schedule-to-start).
    queue_timeout_s: float = Field(default=QUEUE_TIMEOUT_S, gt=0)
    # The agent step's heartbeat timeout (an activity option: changing it is replay-safe).
    agent_heartbeat_s: float = Field(default=AGENT_HEARTBEAT_S, gt=0)
    # Workers watch each other (``workflows.worker_watch``): a dead worker's agent step is
    # signalled lost (``SIG_AGENT_WORKER_LOST``) and scheduled again at once; False before it.
    worker_watch: bool = False
    policy: PolicyRef | None = None  # the trainer's policy this rollout samples with
    # Fleet-wide admission (``workflows.admission``): each attempt holds a ticket from before
    # provision until after teardown; None in every history recorded before it existed.
    admission: Admission | None = None
    # The history shape the parent chose, kept in the child's start event (replay-safe like a
    # patch marker, at no cost): ``CARD_LAYOUT`` = the card's steps; 0-4 = earlier releases'
    # shapes, run by ``workflows.legacy`` (0: histories recorded before the field existed). A
    # worker refuses a layout above the ones it knows (the input does not validate): the task
    # fails until a newer worker takes it.
    layout: int = Field(default=0, ge=0, le=CARD_LAYOUT)


class ResolveGroupInput(_Model):
    taskset_name: str
    taskset_class: str | None = None
    task: Task


class LoadRowsInput(_Model):
    uri: str
    start: int
    stop: int


class ExtendRowsInput(_Model):
    """A batch's rows so far (``base_ref``, or inline ``base_rows``) and the rows added after."""

    base_ref: str | None = None
    base_rows: list[Task] = Field(default_factory=list)
    base_total: int
    added_ref: str
    added_total: int = Field(ge=1)


class AddRows(_Model):
    """Further rows for a running streamed batch (``LiveJob.add``): paged in storage first.

    ``agent``, ``provider`` and ``taskset_class`` are what the caller would run them with; they
    must be the batch's own (a batch runs one agent on one runtime)."""

    id: str  # the call's own id: the same add sent again is taken once
    rows_ref: str
    positions: int = Field(ge=1)  # rows x epochs
    group: int | None = None
    agent: AgentSpec | None = None
    provider: ProviderSpec | None = None
    taskset_class: str | None = None


class AddedRows(_Model):
    """What an add did: its rows are positions ``first..first+positions`` of the batch."""

    first: int
    positions: int
    rollouts: int
    rows_ref: str  # the batch's rows now (a chain of what it had and the additions)
    total_rows: int


class StoreResultsInput(_Model):
    job_id: str
    batch_index: int
    chunk: int
    results: list[RolloutResult]
