"""`rollouts run --detach --stream` and `rollouts stream` as real subprocesses on the embedded dev
server, with the background worker `run --detach` starts.

One JSON line per finished group; every batch is acknowledged in the job's workflow only once
its lines are out, so a second run with the same consumer prints only what was not acknowledged.
A consumer killed while a batch was in hand (blocked writing to a full pipe; SIGKILLed right
after its first line reached a file) gets that batch again, and a file never holds a group twice.
SIGTERM stops after the batch in hand; `--close` lets a lingering job finish, and a closed job can
still be read, each group once in all (its acknowledgements are stored next to its pages). Cursors are read from the workflow (its ``stream_view`` query), not from our logs.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import os
import signal
import subprocess
import termios
import time
from pathlib import Path

import pytest
from cli_helpers import (
    LETTERS,
    alive,
    assert_one_line_error,
    cli_env,
    flaky_config,
    rollouts,
    rollouts_cmd,
    wait_until,
)

from durable_rollouts.cli.consume import FileSink
from durable_rollouts.errors import ConfigError

AGENT = "flaky_agent:FlakyAgent"
FIXED = ["--agent", "fixed", "--agent-config", json.dumps({"answer": "2"})]


def tasks_file(tmp_path: Path, n: int) -> Path:
    """``n`` letters rows (count the r's of ``w<i>rr``: the answer 2 is right)."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"env": "letters", "id": "count_letter", "source": str(LETTERS),
                                        "args": {"word": f"w{i}rr", "letter": "r"}}) + "\n"
                            for i in range(n)))
    return path


def start_streamed(tasks: Path | str, workers: list[int], *args: str) -> str:
    """``run --detach --stream ARGS``; returns the job id (its background worker is cleaned up)."""
    result = rollouts("run", str(tasks), "--group", "2", "--detach", "--stream", "--json", *args)
    assert result.code == 0, result.err
    info = result.json()
    workers.append(info["worker_pid"])
    return str(info["job_id"])


def lines_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def view(address: str, job_id: str, consumer: str) -> tuple[int, int, bool]:
    """(the consumer's cursor, groups delivered, done) from the job's own stream query."""
    async def read() -> tuple[int, int, bool]:
        from durable_rollouts.sdk.job import Job
        from durable_rollouts.temporal.connection import connect_client

        job = await Job.attach(job_id, temporal=await connect_client(address), worker=False)
        found = await job.view(consumer, 0, 1)
        return found.cursor, found.delivered, found.done
    return asyncio.run(read())


def status(job_id: str) -> str:
    return str(rollouts("show", job_id, "--json").json()["status"])


def popen_stream(job_id: str, *args: str, stdout: object = subprocess.PIPE,
                 stderr: object = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*rollouts_cmd(), "stream", job_id, *args], stdout=stdout, stderr=stderr,
                            env=cli_env(), start_new_session=True)


def test_stream_prints_each_group_once_acks_it_and_close_lets_the_job_finish(
        embedded_server, tmp_path, background_workers) -> None:
    """Lines per group with their members' outcomes; acknowledged groups never come again; the
    stream options of `run --stream` reach the job (one group at a time while nothing is
    acknowledged); `--close` ends a job that waits for a lagging consumer, which can still read it."""
    job_id = start_streamed(LETTERS, background_workers, "--agent", AGENT,
                            "--agent-config", flaky_config(tmp_path), "--consumer", "cli",
                            "--consumer", "lagging", "--max-in-flight", "2", "--max-staleness", "0")
    log = tmp_path / "agent.log"
    wait_until(lambda: view(embedded_server.address, job_id, "cli")[1] == 2, timeout=60,
               what="the first two groups")
    time.sleep(2.0)  # nothing is acknowledged: a third group may not start
    assert len(log.read_text().split()) == 4
    assert view(embedded_server.address, job_id, "cli")[:2] == (0, 2)

    # --batch-size 3 > --max-in-flight 2: batches of 2 (a third group waits for an ack)
    first = rollouts("stream", job_id, "--consumer", "cli", "--batch-size", "3", timeout=120)
    assert first.code == 0, first.err
    groups = lines_of(first.out)
    assert [g["batch"] for g in groups] == ["cli:0-2"] * 2 + ["cli:2-4"] * 2
    assert [g["seq"] for g in groups] == [0, 1, 2, 3]
    answers = {"count_letter": ("3", 1.0), "reverse_word": ("reward", 1.0), "vowels": ("", 0.0)}
    for group in groups:
        assert group["job_id"] == job_id and group["size"] == 2 and group["dropped_samples"] == 0
        assert group["policy_version"] is None and group["group_id"].startswith(job_id)
        task_id = group["slug"].rsplit("-", 1)[0]
        assert [m["group_index"] for m in group["rollouts"]] == [0, 1]
        for member in group["rollouts"]:
            assert member["status"] == "succeeded" and member["error"] is None
            assert (member["answer"], member["reward"]) == answers[task_id]
            assert "trace" not in member
    assert sorted(g["row"] for g in groups) == [0, 1, 2, 3]
    rollout_ids = [m["rollout_id"] for g in groups for m in g["rollouts"]]
    assert len(set(rollout_ids)) == 8 and sorted(rollout_ids) == sorted(log.read_text().split())
    assert "consumer 'cli' acknowledged 4 group(s)" in first.err
    assert view(embedded_server.address, job_id, "cli")[0] == 4  # recorded in the workflow

    again = rollouts("stream", job_id, "--consumer", "cli")
    assert again.code == 0 and again.out == "" and "acknowledged 0 group(s)" in again.err
    assert status(job_id) == "running"  # it waits for "lagging"

    closed = rollouts("stream", job_id, "--close")
    assert closed.code == 0 and "stream closed" in closed.out, closed.err
    wait_until(lambda: status(job_id) == "completed", timeout=30, what="the closed job to finish")
    wait_until(lambda: not alive(background_workers[0]), timeout=30, what="its worker to exit")
    assert "already closed" in rollouts("stream", job_id, "--close").out

    # The job has closed: its stream is in storage (no worker needed), and the consumer's
    # acknowledgements are stored next to it: a second read prints nothing.
    out = tmp_path / "late.jsonl"
    late = rollouts("stream", job_id, "--consumer", "lagging", "--traces", "-o", str(out),
                    "--no-worker", timeout=120)
    assert late.code == 0, late.err
    assert late.out == "" and "consumer 'lagging' acknowledged 4 group(s)" in late.err
    twice = rollouts("stream", job_id, "--consumer", "lagging", "--no-worker", timeout=120)
    assert twice.code == 0 and twice.out == "" and "acknowledged 0 group(s)" in twice.err, twice.err
    read = lines_of(out.read_text())
    assert [g["group_id"] for g in read] == [g["group_id"] for g in groups]
    traces = [m["trace"] for g in read for m in g["rollouts"]]
    assert [t["content"] for t in traces] == [m["answer"] for g in groups for m in g["rollouts"]]
    assert len(log.read_text().split()) == 8  # reading never ran a rollout again


def _in_stdout_write(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/syscall").read_text().startswith("1 0x1 ")
    except OSError:
        return False


def _buffered(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def _blocked_writing_stdout(pid: int, fd: int) -> bool:
    """The process's main thread sits in write(1, ...) and the pipe behind ``fd`` does not move:
    it is full (twice, a moment apart, rules out catching a write that goes through)."""
    before = _buffered(fd)
    if not _in_stdout_write(pid):
        return False
    time.sleep(0.3)
    return _in_stdout_write(pid) and _buffered(fd) == before


def test_a_consumer_killed_while_a_batch_is_in_hand_gets_that_batch_again(
        embedded_server, tmp_path, background_workers) -> None:
    """A reader that does not keep up: the CLI blocks writing a line to its full stdout pipe (the
    batch received, not acknowledged) and is SIGKILLed there. Exactly the lines that came out
    were acknowledged; the next run starts with the batch that was in hand."""
    rows = 10
    job_id = start_streamed(tasks_file(tmp_path, rows), background_workers, *FIXED,
                            "--consumer", "slow")
    errors = (tmp_path / "stream.err").open("wb")
    proc = popen_stream(job_id, "--consumer", "slow", stderr=errors)
    try:
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # room for a few lines
        wait_until(lambda: _blocked_writing_stdout(proc.pid, proc.stdout.fileno()), timeout=120,
                   what="the consumer to block on its full stdout")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    data = proc.stdout.read().decode()
    written = lines_of(data[:data.rfind("\n") + 1])
    k = len(written)
    assert 1 <= k < rows, data
    assert [g["seq"] for g in written] == list(range(k))
    assert view(embedded_server.address, job_id, "slow")[0] == k  # acked: exactly what came out

    rest = rollouts("stream", job_id, "--consumer", "slow", timeout=120)
    assert rest.code == 0, rest.err
    again = lines_of(rest.out)
    assert [g["seq"] for g in again] == list(range(k, rows))  # the batch in hand first, then on
    seen = [g["group_id"] for g in written + again]
    assert len(seen) == len(set(seen)) == rows
    wait_until(lambda: status(job_id) == "completed", timeout=30, what="the job to finish")


def test_a_reader_that_closes_the_pipe_is_exit_1_and_the_batch_in_hand_comes_again(
        embedded_server, tmp_path, background_workers) -> None:
    """The reader of stdout goes away while the CLI is blocked writing a batch: one error line
    naming that batch, exit 1, and the batch is still the consumer's next."""
    rows = 10
    job_id = start_streamed(tasks_file(tmp_path, rows), background_workers, *FIXED,
                            "--consumer", "piped")
    proc = popen_stream(job_id, "--consumer", "piped")
    try:
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        wait_until(lambda: _blocked_writing_stdout(proc.pid, proc.stdout.fileno()), timeout=120,
                   what="the consumer to block on its full stdout")
        proc.stdout.close()  # the reader goes away
        err = proc.stderr.read().decode()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    cursor = view(embedded_server.address, job_id, "piped")[0]
    assert proc.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    expected = (f"error: stdout was closed by its reader: batch piped:{cursor}-{cursor + 1} "
                "was not acknowledged; consumer 'piped' gets it again next time")
    assert lines == [expected], err
    assert 1 <= cursor < rows
    rest = rollouts("stream", job_id, "--consumer", "piped", timeout=120)
    assert rest.code == 0 and [g["seq"] for g in lines_of(rest.out)] == list(range(cursor, rows))


def test_a_file_consumer_killed_mid_stream_leaves_every_group_in_the_file_once(
        embedded_server, tmp_path, background_workers) -> None:
    """SIGKILL as soon as the first line is on disk (the ack, a round trip through the job's
    workflow, usually still under way): the next run acknowledges what the file already holds
    without writing it again, and writes the rest; the file ends with each group once, in order."""
    rows = 6
    job_id = start_streamed(tasks_file(tmp_path, rows), background_workers, *FIXED,
                            "--consumer", "disk", "--consumer", "keep-open")
    out = tmp_path / "groups.jsonl"
    proc = popen_stream(job_id, "--consumer", "disk", "-o", str(out), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while b"\n" not in (out.read_bytes() if out.exists() else b""):
            assert time.monotonic() < deadline and proc.poll() is None, "no line reached the file"
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    on_disk = out.read_bytes().count(b"\n")
    cursor = view(embedded_server.address, job_id, "disk")[0]
    assert cursor <= on_disk  # never acknowledged before it was on disk

    rest = rollouts("stream", job_id, "--consumer", "disk", "-o", str(out), timeout=120)
    assert rest.code == 0, rest.err
    if on_disk > cursor:  # written, then killed before the ack: delivered again, not re-written
        assert f"{on_disk - cursor} already in {out}" in rest.err
    groups = lines_of(out.read_text())
    assert [g["seq"] for g in groups] == list(range(rows))
    assert len({g["group_id"] for g in groups}) == rows
    assert view(embedded_server.address, job_id, "disk")[0] == rows
    again = rollouts("stream", job_id, "--consumer", "disk", "-o", str(out))
    assert again.code == 0 and out.read_text().count("\n") == rows
    assert rollouts("stream", job_id, "--close").code == 0


def test_sigterm_stops_after_the_batch_in_hand_and_the_rest_comes_next_time(
        embedded_server, tmp_path, background_workers) -> None:
    slow = ["--agent", "sleep", "--agent-config", json.dumps({"seconds": 2, "answer": "x"}),
            "--max-concurrent", "1"]
    result = rollouts("run", str(LETTERS), "--detach", "--stream", "--json", *slow,
                      "--consumer", "term")
    assert result.code == 0, result.err
    job_id = result.json()["job_id"]
    background_workers.append(result.json()["worker_pid"])
    proc = popen_stream(job_id, "--consumer", "term")
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)  # while it waits for the next group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    printed = lines_of((first + out).decode())
    message = err.decode()
    assert f"consumer 'term' acknowledged {len(printed)} group(s)" in message, message
    assert "delivered to it next time" in message and "Traceback" not in message
    rest = rollouts("stream", job_id, "--consumer", "term", timeout=120)
    assert rest.code == 0, rest.err
    assert [g["seq"] for g in printed + lines_of(rest.out)] == [0, 1, 2, 3]


@pytest.mark.parametrize(("args", "needle"), [
    (["stream", "some-job"], "--consumer NAME is required"),
    (["stream", "some-job", "--consumer", "bad name!"], "consumer name 'bad name!'"),
    (["stream", "some-job", "--close", "--consumer", "a"], "--close does not read the stream"),
    (["stream", "some-job", "--unregister"], "--unregister needs --consumer NAME"),
    (["stream", "some-job", "--unregister", "--consumer", "bad name!"], "consumer name 'bad name!'"),
    (["stream", "some-job", "--unregister", "--close", "--consumer", "a"], "--close and --unregister"),
    (["stream", "some-job", "--consumer", "a", "--batch-size", "0"], "--batch-size"),
    (["stream", "some-job", "--consumer", "a", "-o", "no/such/dir/x.jsonl"], "does not exist"),
    (["run", str(LETTERS), "--agent", "fixed", "--stream"], "--stream needs --detach"),
    (["run", str(LETTERS), "--agent", "fixed", "--detach", "--max-in-flight", "2"], "need --stream"),
    (["run", str(LETTERS), "--agent", "fixed", "--detach", "--stream", "--max-staleness", "-1"],
     "--max-staleness"),
    (["run", str(LETTERS), "--agent", "fixed", "--detach", "--stream", "--consumer", "a b"],
     "consumer name 'a b'"),
])
def test_bad_stream_input_is_one_error_line_before_anything_starts(args, needle) -> None:
    assert_one_line_error(rollouts(*args), needle)


def test_a_job_that_does_not_stream_or_does_not_exist_is_exit_2(embedded_server, tmp_path) -> None:
    assert_one_line_error(rollouts("stream", "no-such-job", "--consumer", "a"), "no job with id")
    plain = rollouts("run", str(LETTERS), *FIXED, "--json")
    assert plain.code == 0, plain.err
    job_id = plain.json()["job_id"]
    assert_one_line_error(rollouts("stream", job_id, "--consumer", "a"), "does not stream")
    assert_one_line_error(rollouts("stream", f"job-{job_id}", "--close"), "does not stream")


def test_rollouts_add_feeds_the_running_jobs_stream_and_a_closed_job_takes_nothing(
        embedded_server, tmp_path, background_workers) -> None:
    """`rollouts add JOB TASKS --epochs 2`: the rows run after the job's own and the same consumer
    reads them in the same stream; once the job has closed an add is exit 2 and adds nothing."""
    job_id = start_streamed(tasks_file(tmp_path, 2), background_workers, *FIXED, "--consumer", "cli")
    more = tmp_path / "more"
    more.mkdir()
    added = rollouts("add", job_id, str(tasks_file(more, 3)), "--epochs", "2", "--seed", "1")
    assert added.code == 0 and "12 rollouts added (6 rows from position 2)" in added.out, added.err
    read = rollouts("stream", job_id, "--consumer", "cli", "--batch-size", "4", timeout=120)
    assert read.code == 0, read.err
    groups = lines_of(read.out)
    assert len(groups) == 8 and sorted(g["row"] for g in groups) == list(range(8))
    assert len({g["group_id"] for g in groups}) == 8 and all(g["size"] == 2 for g in groups)
    assert sum(g["slug"].endswith("-a1") for g in groups) == 6  # the add's rows
    assert sum(g["slug"].endswith("-e1-a1") for g in groups) == 3  # its second epoch
    wait_until(lambda: status(job_id) == "completed", timeout=60, what="the job to close")
    assert_one_line_error(rollouts("add", job_id, str(tasks_file(more, 1))), "has closed")
    shown = rollouts("show", job_id, "--json").json()["rollouts"]
    assert len(shown) == 16 and {r["status"] for r in shown} == {"succeeded"}  # nothing was added


@pytest.mark.parametrize(("args", "needle"), [
    (["add", "some-job", "no/such/tasks.jsonl"], "tasks file not found"),
    (["add", "some-job", str(LETTERS), "--epochs", "0"], "epochs=0"),
])
def test_bad_add_input_is_one_error_line(args, needle) -> None:
    assert_one_line_error(rollouts(*args), needle)


def test_a_file_sink_skips_the_groups_it_holds_and_cuts_a_line_a_kill_left_short(tmp_path) -> None:
    """The file side of the redelivery rule, on a real file: groups of this job already in it are
    not written again, other jobs' lines are kept, a cut-off last line goes, a foreign file is
    refused."""
    path = tmp_path / "groups.jsonl"
    mine = {"job_id": "j1", "group_id": "j1-g0"}
    other = {"job_id": "j2", "group_id": "j1-g1"}
    new = {"job_id": "j1", "group_id": "j1-g1"}
    path.write_text(json.dumps(mine) + "\n" + json.dumps(other) + "\n" + '{"job_id": "j1", "gro')
    sink = FileSink(path, "j1")
    assert sink.seen == {"j1-g0"}
    assert sink.write([("j1-g0", "dup\n"), ("j1-g1", json.dumps(new) + "\n")]) == 1
    sink.close()
    assert path.read_text().splitlines() == [json.dumps(mine), json.dumps(other), json.dumps(new)]
    assert FileSink(path, "j1").seen == {"j1-g0", "j1-g1"}
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello\n")
    with pytest.raises(ConfigError, match="line 1 is not a `rollouts stream` line"):
        FileSink(foreign, "j1")
