"""``rollouts stream``: consume a streamed job's finished groups as JSON lines, acking each batch;
``rollouts add``: give a running streamed job further rows.

Thin typer functions; the bodies live in ``cli.consume`` (imported lazily).
"""

from __future__ import annotations

from typing import Annotated

import typer

from durable_rollouts.cli.common import ConnectTimeoutOption, TemporalOption, drive, fail

__all__ = ["app"]

app = typer.Typer()  # merged into the ``rollouts`` app (cli/__init__.py)

_HELP = """Print the finished groups of JOB (a job started with `run --detach --stream` or Taskset.start) as one JSON line per group, in completion order, and acknowledge each batch once its lines are written (flushed; fsynced for a file). Ends with exit code 0 when the job delivers no more groups.

Acknowledgements are durable and per consumer, also after the job has closed (they are then stored next to its stream's pages): run it again with the same --consumer and it prints only what that consumer has not acknowledged. A batch that was printed but not acknowledged (Ctrl-C, SIGTERM, a kill, a closed pipe) is delivered again next time, so a line on stdout may repeat after a restart; with -o FILE, groups already in FILE are acknowledged without being written twice. Ctrl-C / SIGTERM stop after the batch in hand is acknowledged (exit 130).

Each line: job_id, batch, seq, group_id, row, slug, size (the members kept: normalise advantages over it), dropped_samples, policy_version, and rollouts: rollout_id, group_index, status, reward (null unless succeeded), policy_version, error and answer; --traces adds each rollout's whole trace.

--close lets the job finish once its rollouts are done, even if consumers have not caught up (a job stays open for its consumers up to its linger time).

--unregister with --consumer NAME stops the job holding groups for NAME (a consumer that crashed or is done for now): the groups the other consumers acknowledged then leave the job's state for its stream's pages. NAME's cursor is kept: streaming as NAME again resumes from it.

Exit code: 0 the stream ended (or --close or --unregister was recorded), 1 Temporal failed or the output broke, 2 bad input: an unknown job, a job that does not stream, a bad consumer name.
"""

_EPILOG = """Examples:

  rollouts stream 3f2a9c... --consumer trainer -o -

  rollouts stream 3f2a9c... --consumer eval --batch-size 8 -o groups.jsonl

  rollouts stream 3f2a9c... --close

  rollouts stream 3f2a9c... --consumer eval --unregister
"""


@app.command("stream", help=_HELP, epilog=_EPILOG)
def stream(
    job: Annotated[str, typer.Argument(help="job id (as printed by `rollouts run --detach`)")],
    consumer: Annotated[
        str | None,
        typer.Option("--consumer", help="consumer name: 1-64 letters, digits, '_', '.', '-'"),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=1000, help="groups per acknowledged batch")
    ] = 1,
    output: Annotated[
        str, typer.Option("-o", "--output", help="JSONL file to append to ('-' = stdout)")
    ] = "-",
    traces: Annotated[
        bool, typer.Option("--traces", help="put each rollout's whole trace in its line")
    ] = False,
    close: Annotated[
        bool, typer.Option("--close", help="let the job finish without waiting for its consumers")
    ] = False,
    unregister: Annotated[
        bool, typer.Option("--unregister", help="stop holding groups for --consumer (its cursor is kept)")
    ] = False,
    temporal: TemporalOption = None,
    worker: Annotated[
        bool | None,
        typer.Option(
            "--worker/--no-worker",
            help="run a worker in this process (default: only for a job an earlier release "
            "closed, whose stream is not in storage, to answer the stream's queries)",
        ),
    ] = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    from durable_rollouts.cli.consume import StreamArgs, close_stream, stream_job, unregister_consumer

    args = StreamArgs(job=job, consumer=consumer, batch_size=batch_size, output=output,
                      traces=traces, temporal=temporal, worker=worker,
                      connect_timeout=connect_timeout)
    if close and unregister:
        fail("--close and --unregister do different things: give one of them")
    if close:
        drive(lambda out, err: close_stream(args, out))
    elif unregister:
        drive(lambda out, err: unregister_consumer(args, out))
    else:
        drive(lambda out, err: stream_job(args, err))


_ADD_HELP = """Give the running streamed job JOB the rows of TASKS (a .py, .json or .jsonl file), EPOCHS times: they run after the rows it has, with its agent, runtime and group, and its stream delivers their groups to the same consumers, under the same cursors. A row added again is a new group (its slug gets -a<k> for the k-th add).

Exit code: 0 the rows were added, 1 Temporal failed, 2 bad input: an unknown job, a job that does not stream, has closed or runs --epochs until closed, a bad tasks file or --epochs.
"""


@app.command("add", help=_ADD_HELP, epilog="Example:\n\n  rollouts add 3f2a9c... more_tasks.jsonl --epochs 2 --seed 1\n")
def add(
    job: Annotated[str, typer.Argument(help="job id (as printed by `rollouts run --detach --stream`)")],
    tasks: Annotated[str, typer.Argument(help="tasks file: .py, .json or .jsonl")],
    epochs: Annotated[int, typer.Option("--epochs", help="add the rows this many times, each epoch in its own order")] = 1,
    seed: Annotated[int | None, typer.Option("--seed", help="seed of the epochs' orders (default 0 with --epochs)")] = None,
    temporal: TemporalOption = None,
    connect_timeout: ConnectTimeoutOption = 5.0,
) -> None:
    from durable_rollouts.cli.consume import StreamArgs, add_rows

    args = StreamArgs(job=job, consumer=None, batch_size=1, output="-", traces=False,
                      temporal=temporal, worker=False, connect_timeout=connect_timeout)
    drive(lambda out, err: add_rows(args, tasks, epochs, seed, out))
