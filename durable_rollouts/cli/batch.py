"""``rollouts run`` and ``rollouts resume``: start batches, follow them, summarize, export.

Without a Temporal address (option or ``$ROLLOUTS_TEMPORAL_ADDRESS``) the embedded dev server is
used with a worker inside this process; ``--detach`` instead starts a background
``rollouts worker --until-job JOB`` (its own session, log in ``$ROLLOUTS_HOME/workers/``) that
exits once the job has closed, because an in-process worker cannot outlive the CLI. With an
address, workers are expected to be running already (``--worker`` adds one in this process).
Each function returns the exit code: 0 every rollout succeeded, 1 some did not.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from durable_rollouts.cli import render
from durable_rollouts.stores.row_pages import check_epochs
from durable_rollouts.temporal.jobs import connect, load_job
from durable_rollouts.temporal.queues import batch_queue, job_queue
from durable_rollouts.temporal.resume import plan_resume, start_resume
from durable_rollouts.temporal.select import parse_only

from ..errors import ConfigError
from ..paths import rollouts_home
from ..settings import settings
from .output import check_output, job_json, policy_notes, write_export
from .progress import follow

__all__ = [
    "RunOptions",
    "announce",
    "check_output",
    "finish",
    "job_json",
    "policy_notes",
    "resume_job",
    "run_batch",
    "ui_base",
    "write_export",
    "write_runs",
]


@dataclass
class RunOptions:
    tasks: str
    agent: str
    agent_config: dict[str, Any]
    runtime: str
    group: int = 1
    max_concurrent: int = 16
    rollout_timeout: float | None = None
    name: str | None = None
    temporal: str | None = None
    detach: bool = False
    as_json: bool = False
    output: str | None = None
    worker: bool | None = None
    task_queue: str | None = None
    connect_timeout: float = 5.0
    retries: int = 0
    on_error: str = "keep"
    export_format: str = "jsonl"
    stream: bool = False
    max_in_flight: int | None = None
    max_staleness: int | None = None
    consumers: list[str] = field(default_factory=list)
    epochs: int = 1
    seed: int | None = None
    max_provisions_per_s: float | None = None
    max_substrates: int | None = None


def ui_base(address: str | None) -> str | None:
    """The Web UI base url: ``$ROLLOUTS_TEMPORAL_UI``, else the embedded server's (when it is the one used)."""
    from durable_rollouts.temporal.connection import resolve_address

    explicit = settings().temporal_ui
    if explicit:
        return explicit
    try:
        state = json.loads((rollouts_home() / "temporal.json").read_text())
    except (OSError, ValueError):
        return None
    resolved = resolve_address(address)
    if resolved is not None and resolved != f"127.0.0.1:{state.get('port')}":
        return None
    return f"http://127.0.0.1:{state['ui_port']}" if state.get("ui_port") else None


def _address(client: Any) -> str:
    return str(client.service_client.config.target_host)


@contextlib.asynccontextmanager
async def _in_process_worker(client: Any, task_queue: str, enabled: bool,
                             max_concurrent: int | None = None) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    from ..capacity import slots_for
    from ..worker import build_worker

    async with build_worker(client, task_queue=task_queue,
                            max_concurrent_activities=slots_for(max_concurrent)):
        yield


def announce(err: Console, view_id: str, what: str, ui: str | None) -> None:
    """Print ``job ID: what`` and the job's Web UI link (when there is a UI) on ``err``."""
    err.print(f"job {view_id}: {what}", highlight=False)
    link = render.ui_link(ui, view_id)
    if link:
        err.print(f"Web UI: {link}", highlight=False, soft_wrap=True)


async def finish(
    client: Any,
    job_id: str,
    out: Console,
    *,
    as_json: bool,
    output: str | None,
    ui: str | None,
    export_format: str = "jsonl",
) -> int:
    """Summarize the whole job (and export it with ``output``); 0 if every rollout succeeded
    (so also 1 when ``on_error=fail`` stopped a batch)."""
    if output == "-" and as_json:
        raise ConfigError("-o - and --json both write to stdout: pick one")
    view = await load_job(client, job_id, traces=output is not None)
    runs = view.runs
    if output is not None:
        write_export(view, output, export_format)
        if output == "-":
            out = Console(
                stderr=True, markup=False, highlight=False, width=out.width
            )  # stdout has the runs
    failed = [r for r in runs if r.status != "succeeded"]
    if as_json:
        out.print_json(json.dumps(job_json(view, ui)))
    else:
        out.print(render.summary_table(render.task_summary(runs)))
        out.print(render.totals_line(runs), highlight=False)
        policy_notes(view, out)
        if failed:
            out.print(
                f"re-run the {len(failed)} unsuccessful rollout(s) with: rollouts resume {job_id}",
                highlight=False,
            )
        if output is not None:
            out.print(
                f"wrote {len(runs)} runs to {'stdout' if output == '-' else output}",
                highlight=False,
            )
    return 1 if failed else 0


def _stream_options(opts: RunOptions) -> Any:
    """The ``StreamOptions`` of ``--stream`` (None without it); ConfigError for bad input."""
    if not opts.stream:
        if opts.max_in_flight is not None or opts.max_staleness is not None or opts.consumers:
            raise ConfigError("--max-in-flight, --max-staleness and --consumer need --stream")
        return None
    if not opts.detach:
        raise ConfigError("--stream needs --detach: the job stays open for its consumers; "
                          "read it with `rollouts stream JOB --consumer NAME`")
    from durable_rollouts.temporal.live import stream_options

    return stream_options(opts.max_in_flight, opts.max_staleness, "resample", 3600.0,
                          opts.consumers)


async def run_batch(opts: RunOptions, out: Console, err: Console) -> int:
    from durable_rollouts.temporal.batches import check_policy, start_job
    from durable_rollouts.temporal.connection import resolve_address

    from ..sdk.job import Job
    from ..sdk.taskset_hooks import check_taskset_flags
    from ..sdk.validation import validate_batch
    from .specs import admit_runtime, check_sources, load_agent_spec, load_tasks, parse_runtime

    check_output(opts.output, opts.as_json, opts.export_format, opts.detach)
    check_epochs(opts.epochs, opts.seed)
    stream = _stream_options(opts)
    on_error = check_policy(opts.retries, opts.on_error)
    taskset = load_tasks(opts.tasks, opts.name)
    agent = load_agent_spec(opts.agent, opts.agent_config)
    runtime = parse_runtime(opts.runtime)
    admit_runtime(runtime, opts.max_provisions_per_s, opts.max_substrates)
    check_sources(taskset, runtime)
    check_taskset_flags(taskset, group=opts.group, runtime=runtime)
    validate_batch(
        list(taskset),
        runtime=runtime,
        group=opts.group,
        max_concurrent=opts.max_concurrent,
        rollout_timeout=opts.rollout_timeout,
        agent_timeout=agent.timeout_s,
    )
    embedded = resolve_address(opts.temporal) is None
    if opts.detach or not embedded:
        from ..sdk.agents import check_remote

        check_remote(agent.spec())
    client = await connect(opts.temporal, opts.connect_timeout)
    in_process = (embedded and not opts.detach) if opts.worker is None else opts.worker
    job = Job(name=opts.name or taskset.name, group=opts.group, taskset=taskset.name)
    # The job's own queue when this process (or, detached, its background worker) runs it:
    # another script's rollouts never land here, nor ours there (temporal/queues.py).
    queue = batch_queue(opts.task_queue, job_id=job.id, in_process=in_process)
    if opts.detach and embedded and opts.task_queue is None:
        # The background worker serves this job only: it never hosts another job's substrates
        # when it exits, and attached runs never wait on it.
        queue = job_queue(job.id)
    handle = await start_job(
        taskset,
        agent,
        runtime=runtime,
        group=opts.group,
        max_concurrent=opts.max_concurrent,
        job=job,
        rollout_timeout=opts.rollout_timeout,
        temporal=client,
        name=opts.name,
        worker=in_process,
        task_queue=queue,
        retries=opts.retries,
        on_error=on_error,
        stream=stream,
        epochs=opts.epochs,
        seed=opts.seed,
    )
    total = len(taskset) * opts.group * opts.epochs
    epochs = f" x {opts.epochs} epochs" if opts.epochs > 1 else ""
    what = (f"{len(taskset)} tasks x {opts.group}{epochs} = {total} rollouts, "
            f"agent {agent.spec().path}, runtime {runtime.spec().kind}")
    return await _attend(opts, handle, client, queue, embedded, what, total, out, err)


async def _attend(opts: RunOptions, handle: Any, client: Any, queue: str, embedded: bool,
                  what: str, total: int, out: Console, err: Console) -> int:
    """Detach, or follow the started batch to its summary (exit code)."""
    ui = ui_base(opts.temporal)
    try:  # the in-process worker (if any) is stopped before the command returns
        if opts.detach:
            return _detached(handle.job.id, handle.workflow_id, client, queue, embedded, ui, out,
                             err, opts.as_json, opts.consumers if opts.stream else None)
        announce(err, handle.job.id, what, ui)
        await follow(handle.handle, err, total=total, label="rollouts")
    finally:
        await handle.release()
    return await finish(client, handle.job.id, out, as_json=opts.as_json, output=opts.output,
                        ui=ui, export_format=opts.export_format)


def _detached(
    job_id: str,
    wf_id: str,
    client: Any,
    queue: str,
    embedded: bool,
    ui: str | None,
    out: Console,
    err: Console,
    as_json: bool,
    consumers: list[str] | None = None,
) -> int:
    """Print the started job (``consumers``: it streams, registered with those)."""
    extra: dict[str, Any] = {} if consumers is None else {"stream_consumers": consumers}
    if embedded:
        from .service import spawn_worker

        pid, log = spawn_worker(_address(client), queue, job_id)
        extra.update(worker_pid=pid, worker_log=str(log))
        note = (
            f"a background worker (pid {pid}, log {log}) runs it and exits when the job has closed"
        )
    else:
        note = (
            f"the workers polling task queue {queue!r} run it (start some with `rollouts worker`)"
        )
    if as_json:
        out.print_json(
            json.dumps(
                {"job_id": job_id, "workflow_id": wf_id, "ui": render.ui_link(ui, job_id), **extra}
            )
        )
    else:
        out.print(job_id, highlight=False)
        err.print(f"detached: {note}; follow it with `rollouts show {job_id}`", highlight=False)
        if consumers is not None:
            name = consumers[0] if consumers else "NAME"
            err.print(f"read its finished groups with `rollouts stream {job_id} --consumer {name}`",
                      highlight=False)
        link = render.ui_link(ui, job_id)
        if link:
            err.print(f"Web UI: {link}", highlight=False, soft_wrap=True)
    return 0


async def resume_job(
    job_id: str,
    only: list[str] | None,
    out: Console,
    err: Console,
    *,
    temporal: str | None,
    detach: bool = False,
    as_json: bool = False,
    output: str | None = None,
    worker: bool | None = None,
    connect_timeout: float = 5.0,
    retries: int | None = None,
    on_error: str | None = None,
) -> int:
    from durable_rollouts.temporal.batches import check_policy
    from durable_rollouts.temporal.connection import resolve_address

    from .specs import add_cwd_to_path

    selectors = parse_only(only)
    # overrides of each batch's own policy (None keeps it)
    if on_error is not None:
        on_error = check_policy(0, on_error)
    if retries is not None:
        check_policy(retries, "keep")
    client = await connect(temporal, connect_timeout)
    view = await load_job(client, job_id)
    plans = plan_resume(view, selectors)
    ui = ui_base(temporal)
    if not plans:
        what = "unsuccessful" if selectors is None else "/".join(sorted(selectors))
        err.print(f"nothing to resume: job {view.job_id} has no {what} rollouts", highlight=False)
        if as_json:
            out.print_json(json.dumps({"job_id": view.job_id, "resumed": 0}))
        return 0
    add_cwd_to_path()  # the agent's module, for a worker in this process
    embedded = resolve_address(temporal) is None
    in_process = (embedded and not detach) if worker is None else worker
    queues = {p.batch.input.task_queue for p in plans}
    rerun = sum(len(p.rerun) for p in plans)
    async with contextlib.AsyncExitStack() as stack:
        for queue in sorted(queues):
            width = sum(p.batch.input.max_concurrent for p in plans if p.batch.input.task_queue == queue)
            await stack.enter_async_context(_in_process_worker(client, queue, in_process, width))
        handles = [
            await start_resume(client, view.job_id, plan, retries=retries, on_error=on_error)
            for plan in plans
        ]
        if detach:
            return _detached(
                view.job_id, handles[0].id, client, min(queues), embedded, ui, out, err, as_json
            )
        announce(
            err,
            view.job_id,
            f"re-running {rerun} rollout(s), keeping {sum(len(p.kept) for p in plans)}",
            ui,
        )
        for plan, handle in zip(plans, handles):
            await follow(handle, err, total=plan.total, label=f"batch {plan.batch.index}")
        return await finish(client, view.job_id, out, as_json=as_json, output=output, ui=ui)
