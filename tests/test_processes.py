"""Process control (``durable_rollouts.processes``) on real child processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from durable_rollouts.processes import kill_session, pid_alive, stop_process, stop_process_async

# Prints its child's pid, then waits; ignores SIGTERM when asked to.
_PARENT = """
import signal, subprocess, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _spawn(mode: str) -> tuple[subprocess.Popen[str], int]:
    """A session leader (``start_new_session``) and the pid of the child it started."""
    proc = subprocess.Popen([sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _running(proc: subprocess.Popen[str]) -> bool:
    return proc.poll() is None


def test_a_process_that_ignores_sigterm_is_killed_after_its_grace() -> None:
    proc, child = _spawn("stubborn")
    began = time.monotonic()
    stop_process(proc.pid, pgid=proc.pid, grace_s=0.5, alive=lambda _pid: _running(proc))
    took = time.monotonic() - began
    assert proc.returncode == -signal.SIGKILL and 0.5 <= took < 3.0
    time.sleep(0.2)
    assert not pid_alive(child)  # the group's straggler went too


async def test_a_process_that_exits_on_sigterm_is_not_killed() -> None:
    proc, child = _spawn("polite")
    await stop_process_async(proc.pid, grace_s=5.0, alive=lambda _pid: _running(proc))
    assert proc.returncode == -signal.SIGTERM
    assert pid_alive(child)  # without pgid only the process itself is signalled
    kill_session(proc.pid)  # the group outlives its leader: one SIGKILL reaches the child
    time.sleep(0.2)
    assert not pid_alive(child)


def test_signalling_a_gone_process_is_fine() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    kill_session(proc.pid)
    stop_process(proc.pid, grace_s=0.1)
    assert not pid_alive(proc.pid)
