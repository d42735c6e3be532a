"""How a batch's workflows spent their time, read from their histories.

After a ``bench_width.py`` run (its server home is the newest ``/tmp/rollouts-bench-*``), or on
any home whose server ran batches::

    python benchmarks/batch_histories.py --home /tmp/rollouts-bench-XXXX [--min-events 100]

starts the home's dev server again (on its sqlite file) and prints, for every ``TasksetRun``
(a batch, or a part of one) with at least ``--min-events`` events:

- its workflow tasks: how many, the share of its life they took, p50 and longest, and the
  longest wait from scheduled to started;
- workflow tasks that timed out or failed (a task that ran past its timeout is one; the worker
  then replays the whole history, which is how a wide part's end slows down);
- when its last child started and when its children completed, and how long it took to close
  after the last one (the batch's tail).

Nothing here changes a workflow: it only reads histories.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from _common import event_seconds as _seconds
from _common import home_client, percentile

_TIMED_OUT = {"workflow_task_timed_out_event_attributes", "workflow_task_failed_event_attributes"}


def summary(name: str, events: list) -> str:  # type: ignore[type-arg]
    """One line on one run's history."""
    t0 = _seconds(events[0])
    tasks, waits, bad = [], [], 0
    scheduled = started = t0
    children_started, children_done = [], []
    for event in events:
        kind = event.WhichOneof("attributes")
        at = _seconds(event)
        if kind == "workflow_task_scheduled_event_attributes":
            scheduled = at
        elif kind == "workflow_task_started_event_attributes":
            started = at
            waits.append(at - scheduled)
        elif kind == "workflow_task_completed_event_attributes":
            tasks.append(at - started)
        elif kind in _TIMED_OUT:
            bad += 1
        elif kind == "child_workflow_execution_started_event_attributes":
            children_started.append(at - t0)
        elif kind == "child_workflow_execution_completed_event_attributes":
            children_done.append(at - t0)
    life = max(1e-9, _seconds(events[-1]) - t0)
    line = (f"{name}: {len(events)} events; {len(tasks)} workflow tasks, busy {sum(tasks) / life:.0%}, "
            f"p50 {percentile(tasks or [0.0], 0.5) * 1000:.0f} ms, longest {max(tasks, default=0):.2f} s; "
            f"scheduled->started longest {max(waits, default=0):.2f} s; timed out or failed: {bad}")
    if children_done:
        line += (f"; {len(children_started)} children started, the last at {max(children_started):.1f} s; "
                 f"completed {min(children_done):.1f}-{max(children_done):.1f} s; closed "
                 f"{life - max(children_done):.1f} s after the last")
    return line


async def main(args: argparse.Namespace) -> None:
    async with home_client(args.home) as client:
        async for wf in client.list_workflows("WorkflowType='TasksetRun'"):
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
            if len(history.events) >= args.min_events:
                print(summary(wf.id, list(history.events)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="a bench run's ROLLOUTS_HOME")
    parser.add_argument("--min-events", type=int, default=100, help="skip smaller histories")
    asyncio.run(main(parser.parse_args()))
