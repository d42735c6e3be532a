"""One command: train the numpy policy on the sums env, SIGKILL the trainer midway, restart it.

``python examples/grpo_numpy/train.py [--temporal HOST:PORT] [--out DIR] [--kill-after-step K]``

It uses the embedded Temporal dev server unless given an address, starts one ``rollouts
worker`` process (it runs the rollouts, and outlives the trainer), runs ``trainer.py``, kills it
with SIGKILL once it applied step K, starts it again (it re-attaches to the same job under the
same consumer name), and when the job is done checks the trainer's own records: every group
applied exactly once, none lost, only the batch the killed trainer held unacknowledged delivered
again. It prints the reward curve, writes ``summary.json`` and the plot, and exits 1 if a check
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from plot import plot_rewards
from tabular_policy import ANSWERS
from trainer import parse as trainer_options

HERE = Path(__file__).resolve().parent


def _events(out: Path) -> list[dict[str, Any]]:
    try:
        lines = (out / "events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    with log.open("ab") as fh:
        return subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait_s: float = 15.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_trainers(args: argparse.Namespace, out: Path, address: str, queue: str,
                 extra: list[str]) -> dict[str, Any]:
    """Trainer 1 until it applied step ``kill_after_step`` (then SIGKILL), then trainer 2 to the end."""
    command = [sys.executable, str(HERE / "trainer.py"), str(out), "--temporal", address, "--task-queue", queue,
               *extra]
    deadline = time.monotonic() + args.timeout
    first = _spawn(command, out / "trainer-1.log")
    killed: dict[str, Any] = {}
    try:
        while first.poll() is None and args.kill_after_step and time.monotonic() < deadline:
            if any(e["event"] == "applied" and e["step"] >= args.kill_after_step for e in _events(out)):
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
                killed = {"pid": first.pid, "after_step": args.kill_after_step, "returncode": first.returncode}
                break
            time.sleep(0.05)
        if not killed:
            first.wait(max(deadline - time.monotonic(), 1))
    finally:
        _stop(first, signal.SIGKILL)
    if killed:
        second = _spawn(command, out / "trainer-2.log")
        try:
            second.wait(max(deadline - time.monotonic(), 1))
        finally:
            _stop(second, signal.SIGKILL)
    return killed


def verify(out: Path, killed: dict[str, Any]) -> dict[str, Any]:
    """What the trainer's checkpoint and event log say about delivery, and the checks on it."""
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    events = _events(out)
    rows = checkpoint["config"]["rows"]
    applied = [g for step in checkpoint["steps"] for g in step["groups"]]
    received = Counter(g for e in events if e["event"] == "received" for g in e["groups"])
    acked_by = {(e["pid"], e["batch"]) for e in events if e["event"] == "acked"}
    held = [e for e in events if e["event"] == "received" and e["pid"] == killed.get("pid")][-1:]
    unacked_at_kill = {g for e in held if (e["pid"], e["batch"]) not in acked_by for g in e["groups"]}
    again = sorted(g for g, n in received.items() if n > 1)
    done = next((e for e in events if e["event"] == "done"), {})
    rewards = [step["mean_reward"] for step in checkpoint["steps"]]
    quarter = max(len(rewards) // 4, 1)
    checks = {
        "trainer killed and restarted": bool(killed) and len({e["pid"] for e in events}) == 2,
        "every group applied exactly once": len(applied) == len(set(applied)) == rows,
        "only the unacknowledged batch delivered again": set(again) <= unacked_at_kill,
        "consumer acknowledged every group": done.get("cursor") == done.get("delivered") == rows,
    }
    return {
        "job_id": checkpoint["job_id"], "rows": rows, "group": checkpoint["config"]["group"],
        "steps": len(rewards), "rewards": rewards,
        "first_quarter": sum(rewards[:quarter]) / quarter, "last_quarter": sum(rewards[-quarter:]) / quarter,
        "killed": killed, "redelivered": again,
        "skipped": [e["batch"] for e in events if e["event"] == "skipped"],
        "stream_counts": done.get("counts", {}), "checks": checks, "ok": all(checks.values()),
    }


def report(summary: dict[str, Any], seconds: float, plot: Path, drawn_by: str) -> None:
    killed = summary["killed"]
    print(f"job {summary['job_id']}: {summary['rows']} groups x {summary['group']} rollouts, "
          f"{summary['steps']} GRPO steps in {seconds:.1f} s")
    if killed:
        print(f"trainer pid {killed['pid']} SIGKILLed after step {killed['after_step']}, restarted; "
              f"delivered again: {len(summary['redelivered'])} groups, skipped batches: {summary['skipped'] or 'none'}")
    print("reward per step: " + " ".join(f"{r:.2f}" for r in summary["rewards"]))
    print(f"mean reward: first quarter {summary['first_quarter']:.2f} -> last quarter {summary['last_quarter']:.2f}")
    if summary["stream_counts"]:
        print(f"stream counts: {summary['stream_counts']}")
    for name, ok in summary["checks"].items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    print(f"plot ({drawn_by}): {plot}")


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Other options (--rows, --group, --batch-size, --lr, ...) go to trainer.py.")
    parser.add_argument("--temporal", help="Temporal address (default: the embedded dev server)")
    parser.add_argument("--out", help="run directory (default: a new temporary one)")
    parser.add_argument("--kill-after-step", type=int, default=8, help="SIGKILL the trainer once it applied "
                        "this step (0: never)")
    parser.add_argument("--plot", help="where to write the PNG (default OUT/reward.png)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="grpo-"))
    trainer_options([str(out), *extra])  # a bad option is a usage error now, not a dead trainer later
    out.mkdir(parents=True, exist_ok=True)
    address = args.temporal
    if address is None:
        from durable_rollouts.temporal.connection import ensure_dev_server

        address = asyncio.run(ensure_dev_server()).address
    queue = f"grpo-{uuid.uuid4().hex[:8]}"  # this run's worker only
    started = time.monotonic()
    worker = _spawn([sys.executable, "-m", "durable_rollouts.cli", "worker", "--temporal", address,
                     "--task-queue", queue, "--gc-every", "0"], out / "worker.log")
    try:
        killed = run_trainers(args, out, address, queue, extra)
    finally:
        _stop(worker)
    seconds = time.monotonic() - started
    if not (out / "checkpoint.json").exists():
        print(f"error: the trainer did not start a job; see {out / 'trainer-1.log'}", file=sys.stderr)
        return 1
    summary = verify(out, killed)
    plot = Path(args.plot) if args.plot else out / "reward.png"
    drawn_by = plot_rewards(summary["rewards"], plot, restart_after=(killed or {}).get("after_step"),
                            guess=1 / len(ANSWERS))
    summary.update(seconds=round(seconds, 1), plot=str(plot))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    report(summary, seconds, plot, drawn_by)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
