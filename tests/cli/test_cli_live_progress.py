"""`rollouts run` on a terminal: the live progress bar really renders, fed while the batch runs."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import threading

from cli_helpers import LETTERS, cli_env, rollouts_cmd


def _drain(fd: int, sink: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed its end
            return
        if not chunk:
            return
        sink.extend(chunk)


def test_run_on_a_terminal_draws_a_live_bar_that_counts_up_to_the_total(embedded_server) -> None:
    """With stderr on a pseudo-terminal, `run` draws rich's live bar (cursor control codes), shows
    intermediate done/total counts while rollouts finish, ends at total/total with the counters,
    and still prints clean --json on stdout."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*rollouts_cmd(), "run", str(LETTERS), "--agent", "sleep",
         "--agent-config", json.dumps({"seconds": 1.0, "answer": "3"}), "--runtime", "local",
         "--group", "2", "--max-concurrent", "2", "--json"],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, text=True,
        env=cli_env(TERM="xterm"),
    )
    os.close(slave)
    drawn = bytearray()
    reader = threading.Thread(target=_drain, args=(master, drawn), daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        reader.join(timeout=5)
        os.close(master)
    screen = drawn.decode(errors="replace")
    total = json.loads(out)["counts"]
    n = sum(total.values())
    assert n == 8 and proc.returncode in (0, 1), screen[-2000:]
    assert "\x1b[" in screen  # a live display, not one final line
    counts = {int(m.group(1)) for m in re.finditer(rf"(\d+)/{n}\b", screen)}
    assert n in counts and counts & set(range(1, n)), sorted(counts)  # it counted up while running
    assert f"ok {total.get('succeeded', 0)} ·" in screen
