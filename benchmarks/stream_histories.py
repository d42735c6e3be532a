"""Where a streamed job's delivery lag went, read from its batch workflow's histories.

After a ``bench_stream.py --long`` run (it prints its server home at the end), or on any home
whose server ran a streamed job::

    python benchmarks/stream_histories.py --home /tmp/rollouts-bench-XXXX [--job JOB_ID]

starts the home's dev server again (on its sqlite file), takes the job with the most batch runs
(or ``--job``) and prints, from every run's history:

- per consumer, the lag from a group's last child completion to the consumer's ack of it
  (p50 / p90 / p99; with pipelined acks an ack trails its read by at most one round trip), and
  the longest gaps between two of its acks, each with the run start nearest it;
- per run, how busy the batch workflow was: workflow tasks, the share of the run's time they
  took, p50 / p99 of one, and how many accepted updates of each kind it holds.

Nothing here changes the job: it only reads histories.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path

from _common import event_seconds as _seconds
from _common import home_client, percentile


async def main(args: argparse.Namespace) -> None:
    async with home_client(args.home) as client:
        runs: dict[str, list] = defaultdict(list)
        async for wf in client.list_workflows("WorkflowType='TasksetRun'"):
            runs[wf.id].append(wf)
        job = args.job or max(runs, key=lambda k: len(runs[k]))
        chain = sorted(runs[job if job.startswith("job-") else f"job-{job}"], key=lambda w: w.start_time)
        histories = [await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history() for w in chain]
        report(job, histories, args.size)


def report(job: str, histories: list, size: int) -> None:  # type: ignore[type-arg]
    t0 = _seconds(histories[0].events[0])
    starts = [_seconds(h.events[0]) - t0 for h in histories]
    members: Counter[str] = Counter()
    ended: list[float] = []  # group k of the stream ended at ended[k]
    acked: dict[str, dict[int, float]] = defaultdict(dict)
    print(f"job {job}: {len(histories)} runs")
    for n, history in enumerate(histories):
        tasks, busy, kinds, began = [], 0.0, Counter(), None
        for ev in history.events:
            at = _seconds(ev) - t0
            if ev.HasField("child_workflow_execution_completed_event_attributes"):
                data = ev.child_workflow_execution_completed_event_attributes.result.payloads[0].data
                group = json.loads(data).get("group_id")
                members[group] += 1
                if members[group] == size:
                    ended.append(at)
            elif ev.HasField("workflow_task_started_event_attributes"):
                began = at
            elif ev.HasField("workflow_task_completed_event_attributes") and began is not None:
                tasks.append(at - began)
                busy += at - began
            elif ev.HasField("workflow_execution_update_accepted_event_attributes"):
                request = ev.workflow_execution_update_accepted_event_attributes.accepted_request.input
                kinds[request.name] += 1
                if request.name == "stream_ack":
                    ack = json.loads(request.args.payloads[0].data)
                    for k in range(ack["start"], ack["end"]):
                        acked[ack["consumer"]].setdefault(k, at)
        span = (_seconds(history.events[-1]) - t0) - starts[n] or 1e-9
        if tasks:
            print(f"  run {n:3d} at {starts[n]:7.1f} s: {len(tasks)} workflow tasks, busy {busy / span:4.0%}, "
                  f"p50 {percentile(tasks, 0.5) * 1000:.0f} ms, p99 {percentile(tasks, 0.99) * 1000:.0f} ms; "
                  f"updates {dict(kinds)}")
    for consumer, acks in sorted(acked.items()):
        lags = [acks[k] - ended[k] for k in acks if k < len(ended)]
        times = sorted(set(acks.values()))
        gaps = sorted(((b - a, a) for a, b in zip(times, times[1:])), reverse=True)[:5]
        near = [(g, a, min(starts, key=lambda s: abs(s - a))) for g, a in gaps]
        print(f"consumer {consumer}: {len(lags)} groups, lag (last member ended -> acked) p50 "
              f"{percentile(lags, 0.5):.2f} s, p90 {percentile(lags, 0.9):.2f} s, p99 {percentile(lags, 0.99):.2f} s")
        print("  longest gaps between its acks: " + "; ".join(
            f"{g:.1f} s at {a:.1f} s (run start {s:.1f} s)" for g, a, s in near))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True, help="the bench's ROLLOUTS_HOME")
    parser.add_argument("--job", help="job id (default: the job with the most batch runs)")
    parser.add_argument("--size", type=int, default=4, help="rollouts per group")
    asyncio.run(main(parser.parse_args()))
