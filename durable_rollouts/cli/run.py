"""``rollouts run`` and ``rollouts resume``: thin typer functions over ``cli.batch``.

The bodies live in ``cli.batch`` (imported lazily, so ``rollouts --help`` stays fast).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import (
    ConnectTimeoutOption,
    JsonOption,
    TemporalOption,
    WorkerOption,
    drive,
    json_option,
)

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)

RetriesOption = Annotated[
    int,
    typer.Option(
        "--retries", min=0, max=20, help="fresh re-runs of an errored or timed-out rollout"
    ),
]
OnErrorOption = Annotated[
    str,
    typer.Option(
        "--on-error",
        help="keep | drop-group | drop-sample (with --stream) | fail: what an error left after "
        "retries means",
    ),
]

_RUN_HELP = """Run every task of TASKS (a .py, .json or .jsonl file) GROUP times with an agent, durably.

Starts one Temporal batch (on the embedded dev server with a worker in this process, unless --temporal or $ROLLOUTS_TEMPORAL_ADDRESS is set), prints its Web UI link, shows live progress and ends with a per-task summary. Exit code: 0 every rollout succeeded, 1 some did not (re-run them with `rollouts resume JOB`), 2 bad input.

--agent: a built-in (fixed, table, sleep, fail), module:Class or file.py:Class, configured with --agent-config JSON.

--runtime: local[:ENV.py] (served in the worker process), subprocess[:ENV.py], docker:IMAGE, ssh://USER@HOST[:PORT]/WORKDIR[?key=PATH], tcp://HOST:PORT (a running env server).

--retries N re-runs an errored or timed-out rollout fresh (new substrate, same group); --on-error then decides about an error left: keep (default), drop-group (the group is exported with dropped: true and left out of the stats) or fail (cancel the rest of the job; teardown still runs; exit 1). Only succeeded rollouts carry a reward.

--detach with the embedded server starts a background `rollouts worker --until-job JOB` that exits when the job has closed; against --temporal it relies on running workers.

--stream (with --detach) keeps finished groups for consumers: read them with `rollouts stream JOB --consumer NAME`. Each --consumer NAME is registered from the start, and the finished job stays open until every registered consumer has acknowledged every group (or an hour passed without a consumer acting, or `rollouts stream JOB --close`). --max-in-flight N: at most N groups running or delivered but not acknowledged; --max-staleness K: a group sampled more than K policy versions behind the trainer's (Job.set_policy) is re-sampled instead of delivered. --on-error drop-sample keeps a group without its failed members.
"""

_RUN_EPILOG = """Examples:

  rollouts run examples/letters/env.py --agent fixed --agent-config '{"answer": "3"}' --runtime local --group 4

  rollouts run tasks.jsonl --agent agents.py:MyAgent --runtime subprocess:env.py -o runs.jsonl

  rollouts run tasks.py --agent mypkg.agents:Solver --runtime docker:letters-env --temporal temporal:7233 --detach

  rollouts run tasks.py --agent mypkg.agents:Solver --group 8 --detach --stream --consumer trainer --max-in-flight 16
"""


@app.command(help=_RUN_HELP, epilog=_RUN_EPILOG)
def run(
    tasks: Annotated[str, typer.Argument(help="taskset file: .py, .json or .jsonl")],
    agent: Annotated[
        str, typer.Option("--agent", help="built-in name, module:Class or file.py:Class")
    ],
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime", help="local, subprocess, docker:IMAGE, ssh://..., tcp://HOST:PORT"
        ),
    ] = "local",
    agent_config: Annotated[
        str | None, typer.Option("--agent-config", help="agent config as a JSON object")
    ] = None,
    group: Annotated[int, typer.Option("--group", help="rollouts per task (a GRPO group)")] = 1,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", help="rollouts in flight at once")
    ] = 16,
    rollout_timeout: Annotated[
        float | None, typer.Option("--rollout-timeout", help="seconds per rollout attempt")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="job name (default: the taskset's)")
    ] = None,
    temporal: TemporalOption = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="print the job id and return (see below)")
    ] = False,
    as_json: JsonOption = False,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="write the runs as JSONL here ('-' = stdout)"),
    ] = None,
    worker: WorkerOption = None,
    task_queue: Annotated[
        str | None,
        typer.Option(
            "--task-queue", help="task queue; give one (or $ROLLOUTS_TASK_QUEUE) to share the job "
            "with `rollouts worker`s (default: with a worker in this process, the job's own "
            "queue rollouts-job-<id>; else $ROLLOUTS_TASK_QUEUE or 'rollouts')"
        ),
    ] = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
    retries: RetriesOption = 0,
    on_error: OnErrorOption = "keep",
    export_format: Annotated[
        str,
        typer.Option(
            "--format", help="-o format: jsonl, openai, atif (ATIF-v1.8), atif-1.8 or atif-1.4"
        ),
    ] = "jsonl",
    stream: Annotated[
        bool,
        typer.Option("--stream", help="keep finished groups for `rollouts stream` (needs --detach)"),
    ] = False,
    max_in_flight: Annotated[
        int | None,
        typer.Option("--max-in-flight", min=1, help="--stream: groups running or unacknowledged at most"),
    ] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option("--max-staleness", min=0, help="--stream: policy versions a delivered group may lag"),
    ] = None,
    consumers: Annotated[
        list[str] | None,
        typer.Option("--consumer", help="--stream: a consumer the job waits for (repeatable)"),
    ] = None,
    epochs: Annotated[
        int, typer.Option("--epochs", help="run the rows this many times, each epoch in its own order")
    ] = 1,
    seed: Annotated[
        int | None, typer.Option("--seed", help="seed of the epochs' orders (default 0 with --epochs)")
    ] = None,
    max_provisions_per_s: Annotated[
        float | None,
        typer.Option("--max-provisions-per-s",
                     help="substrates created per second at most, across every worker of the queue"),
    ] = None,
    max_substrates: Annotated[
        int | None,
        typer.Option("--max-substrates",
                     help="live substrates at most, across every worker of the queue"),
    ] = None,
) -> None:
    from durable_rollouts.cli.batch import RunOptions, run_batch

    opts = RunOptions(
        tasks=tasks,
        agent=agent,
        agent_config=json_option(agent_config, "--agent-config"),
        runtime=runtime,
        group=group,
        max_concurrent=max_concurrent,
        rollout_timeout=rollout_timeout,
        name=name,
        temporal=temporal,
        detach=detach,
        as_json=as_json,
        output=output,
        worker=worker,
        task_queue=task_queue,
        connect_timeout=connect_timeout,
        retries=retries,
        on_error=on_error,
        export_format=export_format,
        stream=stream,
        max_in_flight=max_in_flight,
        max_staleness=max_staleness,
        consumers=consumers or [],
        epochs=epochs,
        seed=seed,
        max_provisions_per_s=max_provisions_per_s,
        max_substrates=max_substrates,
    )
    drive(lambda out, err: run_batch(opts, out, err))


@app.command(
    epilog="""Examples:

  rollouts resume 3f2a9c...               # every rollout that did not succeed

  rollouts resume 3f2a9c... --only errored --only timeout

  rollouts resume 3f2a9c... --only ungraded -o runs.jsonl
"""
)
def resume(
    job: Annotated[
        str, typer.Argument(help="job id (as printed by `rollouts run` / `rollouts jobs`)")
    ],
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="failed, errored, cancelled, timeout, ungraded (repeatable, or comma-separated)",
        ),
    ] = None,
    temporal: TemporalOption = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="start the re-run and return")
    ] = False,
    as_json: JsonOption = False,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="write the whole job's runs as JSONL here"),
    ] = None,
    worker: WorkerOption = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
    retries: Annotated[
        int | None,
        typer.Option("--retries", min=0, max=20, help="override the batches' --retries"),
    ] = None,
    on_error: Annotated[
        str | None,
        typer.Option("--on-error", help="override the batches' --on-error"),
    ] = None,
) -> None:
    """Re-run only the selected rollouts of a finished job; every other result is kept.

    Rollouts are matched by their stable ids (job, task slug, group index), never by comparing
    configs. Without --only, every rollout that did not succeed is re-run. When nothing matches,
    says so and exits 0. Exit code otherwise as for `run`.
    """
    from durable_rollouts.cli.batch import resume_job

    drive(
        lambda out, err: resume_job(
            job,
            only,
            out,
            err,
            temporal=temporal,
            detach=detach,
            as_json=as_json,
            output=output,
            worker=worker,
            connect_timeout=connect_timeout,
            retries=retries,
            on_error=on_error,
        )
    )
