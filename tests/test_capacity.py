"""A worker's width and the limits that cannot hold it (``durable_rollouts.capacity``): sized
slots, the file-descriptor limit (raised when the hard limit allows, else one warning naming it
and the knob), memory, and in-process env servers that follow the widest worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest

from durable_rollouts import capacity
from durable_rollouts.capacity import DEFAULT_SLOTS, CapacityWarning, check_capacity, slots_for


def test_slots_follow_max_concurrent_in_steps_of_the_default() -> None:
    assert slots_for(None) == slots_for(16) == DEFAULT_SLOTS == 500
    assert slots_for(500) == 1000  # 500 rollouts plus the margin for taskset steps and probes
    assert slots_for(2000) == 2500 and slots_for(5000) == 5500
    assert all(slots_for(n) >= n for n in (1, 437, 499, 1500, 2100, 10_000))


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


def test_a_file_descriptor_limit_the_hard_limit_cannot_lift_is_one_warning_naming_it_and_the_knob() -> None:
    """RLIMIT_NOFILE at 600 (soft and hard): 5,000 slots need ~20,000 descriptors; one
    CapacityWarning says so, names the limit, ulimit and --max-concurrent."""
    done = _run("""
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))
        from durable_rollouts.capacity import check_capacity
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_capacity(5000)
        fd = [str(w.message) for w in caught if "RLIMIT_NOFILE" in str(w.message)]
        print(len(fd)); print(fd[0] if fd else "")
        print(type(caught[0].message).__name__ if caught else "")
    """)
    assert done.returncode == 0, done.stderr
    count, message, kind = done.stdout.splitlines()
    assert count == "1" and kind == "CapacityWarning"
    assert "allows 600" in message and "ulimit -n" in message and "--max-concurrent" in message
    assert "max_concurrent" in message and "5000 slots" in message


def test_a_low_soft_limit_is_raised_to_what_the_slots_need_without_a_warning() -> None:
    done = _run("""
        import resource, warnings
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        from durable_rollouts.capacity import check_capacity
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            problems = check_capacity(1000)
        print(len(problems), len(caught), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    assert done.returncode == 0, done.stderr
    problems, caught, soft = map(int, done.stdout.split())
    assert (problems, caught) == (0, 0) and soft >= 256 + 1000 * capacity.FDS_PER_ROLLOUT


def test_more_slots_than_memory_holds_is_one_warning_naming_the_knob(monkeypatch) -> None:
    monkeypatch.setattr(capacity, "available_memory", lambda: 64 * 2**20)
    with pytest.warns(CapacityWarning, match=r"only 64 MiB of memory") as caught:
        check_capacity(2000)
    assert len(caught) == 1 and "--max-concurrent" in str(caught[0].message)


def test_a_worker_within_the_limits_warns_about_nothing(monkeypatch) -> None:
    monkeypatch.setattr(capacity, "available_memory", lambda: 64 * 2**30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_capacity(DEFAULT_SLOTS) == []


def test_in_process_env_servers_follow_the_widest_worker(monkeypatch) -> None:
    monkeypatch.setattr(capacity, "_PROCESS_SLOTS", 0)
    assert capacity.in_process_limits(2048, 4096) == (2048, 4096)
    capacity.register_slots(5500)
    capacity.register_slots(1000)  # a narrower worker later does not shrink them
    assert capacity.in_process_limits(2048, 4096) == (5500, 11000)
