"""How many rollouts one worker process can hold in flight, and the limits that say it cannot.

A worker's activity slots follow what it is asked to run (:func:`slots_for`): the in-process
worker of ``Taskset.run``/``start`` and ``rollouts run`` is sized to the batch's
``max_concurrent``, ``rollouts worker`` to ``--max-concurrent``. Each in-flight rollout holds one
slot (its agent step) and costs a few file descriptors (its kept connection to the env, both
ends when the env is in-process) and some memory. :func:`check_capacity` compares a worker's
slots with the process's file-descriptor limit (raising the soft limit up to the hard one when
that is enough) and with the memory available, and warns once, naming the limit and the knob,
when they cannot hold it: never a silent cap.

In-process env servers (``LocalRuntime``) serve this process's rollouts only, so their task and
connection limits follow the largest worker built here (:func:`in_process_limits`).

Imports only the standard library: usable from the worker, the sdk and the CLI alike.
"""

from __future__ import annotations

import resource
import warnings

__all__ = [
    "DEFAULT_SLOTS",
    "FDS_PER_ROLLOUT",
    "RSS_PER_ROLLOUT",
    "CapacityWarning",
    "available_memory",
    "check_capacity",
    "in_process_limits",
    "register_slots",
    "slots_for",
]

DEFAULT_SLOTS = 500  # the least a worker gets: unused slots cost nothing
SLOT_MARGIN = 64  # over max_concurrent: taskset activities, teardowns, liveness probes
FDS_PER_ROLLOUT = 4  # a kept connection, both ends for an in-process env, plus a spare
FDS_BASE = 256  # the worker's own: server connections, logs, imports
RSS_PER_ROLLOUT = 256 * 1024  # bytes per in-flight rollout (benchmarks/bench_width.py: 209-228 KiB)
KNOB = "max_concurrent (Taskset.run / rollouts run) or --max-concurrent (rollouts worker)"

_PROCESS_SLOTS = 0  # the most slots any worker built in this process has


class CapacityWarning(UserWarning):
    """A worker was asked for more than this process's limits can hold."""


def slots_for(max_concurrent: int | None) -> int:
    """Activity slots for a worker that holds ``max_concurrent`` rollouts in flight: at least
    ``DEFAULT_SLOTS``, in steps of it (so batches of similar width share one in-process worker)."""
    if not max_concurrent:
        return DEFAULT_SLOTS
    return -(-(max_concurrent + SLOT_MARGIN) // DEFAULT_SLOTS) * DEFAULT_SLOTS


def register_slots(slots: int) -> None:
    """Note a worker of ``slots`` built in this process (sizes in-process env servers)."""
    global _PROCESS_SLOTS
    _PROCESS_SLOTS = max(_PROCESS_SLOTS, slots)


def in_process_limits(max_tasks: int, max_connections: int) -> tuple[int, int]:
    """(max_tasks, max_connections) for an in-process env server: the defaults, or more when
    a worker of this process holds more rollouts than that."""
    return max(max_tasks, _PROCESS_SLOTS), max(max_connections, 2 * _PROCESS_SLOTS)


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux ``MemAvailable``), None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_capacity(slots: int, *, fds_per_rollout: int = FDS_PER_ROLLOUT,
                   rss_per_rollout: int = RSS_PER_ROLLOUT) -> list[str]:
    """Check that this process can hold ``slots`` rollouts; warn (``CapacityWarning``) for each
    limit that cannot, and return the messages. Raises the soft file-descriptor limit up to the
    hard one when that is enough."""
    problems: list[str] = []
    need_fds = FDS_BASE + slots * fds_per_rollout
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and need_fds > soft:
        target = need_fds if hard == resource.RLIM_INFINITY else min(need_fds, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
        if need_fds > soft:
            problems.append(
                f"a worker with {slots} slots needs about {need_fds} file descriptors, but "
                f"RLIMIT_NOFILE allows {soft} (hard limit {hard}): rollouts past about "
                f"{max(0, (soft - FDS_BASE) // fds_per_rollout)} will fail with 'too many open "
                f"files'. Raise it (ulimit -n) or lower {KNOB}.")
    memory = available_memory()
    if memory is not None and slots * rss_per_rollout > memory:
        problems.append(
            f"a worker with {slots} slots needs about {slots * rss_per_rollout // 2**20} MiB for "
            f"its rollouts, but only {memory // 2**20} MiB of memory is available: lower {KNOB} "
            f"or add workers on other machines.")
    for message in problems:
        warnings.warn(message, CapacityWarning, stacklevel=2)
    return problems
