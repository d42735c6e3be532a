"""SSHRuntime over a real SSH hop: an asyncssh server on 127.0.0.1 started by the test.

The server authenticates with generated ed25519 keys (host key checked through a known_hosts
file), runs every command with a real local ``bash -c``, serves SFTP on the local file system and
allows direct TCP/IP channels (what ``forward_local_port`` uses). Nothing is mocked: the runtime
copies files, starts the env server in the background, reads its port and forwards it exactly as
it would against sshd on another machine.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest
from substrates_support import ENV_IMAGE_DIR

from durable_rollouts.client.envclient import connect
from durable_rollouts.client.tokens import substrate_token
from durable_rollouts.envserver import load_environment
from durable_rollouts.errors import ConfigError, ProviderError
from durable_rollouts.runtimes import ssh as ssh_module
from durable_rollouts.runtimes.ssh import SSHRuntime
from durable_rollouts.sdk.agents import FixedAgent
from durable_rollouts.sdk.direct import run_direct
from durable_rollouts.sdk.taskset import Taskset

ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


class _LoopbackServer(asyncssh.SSHServer):
    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        return dest_host in ("127.0.0.1", "localhost")  # local forwards to loopback only


async def _run_with_bash(process: asyncssh.SSHServerProcess) -> None:
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        process.command or "",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    process.stdout.write(out.decode(errors="replace"))
    process.stderr.write(err.decode(errors="replace"))
    process.exit(proc.returncode or 0)


class SSHHost:
    def __init__(self, port: int, key: Path, known_hosts: Path, workdir: Path) -> None:
        self.port, self.key, self.known_hosts, self.workdir = port, key, known_hosts, workdir

    def runtime(self, **kw: object) -> SSHRuntime:
        kw.setdefault("python", sys.executable)
        return SSHRuntime(
            "127.0.0.1",
            os.environ.get("USER", "root"),
            str(self.key),
            port=self.port,
            known_hosts=str(self.known_hosts),
            workdir=str(self.workdir),
            **kw,
        )


async def start_ssh_host(tmp_path: Path) -> tuple[SSHHost, asyncssh.SSHAcceptor]:
    """An SSH server on 127.0.0.1 that runs commands with the local bash."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_path))
    os.chmod(key_path, 0o600)
    authorized = tmp_path / "authorized_keys"
    client_key.write_public_key(str(authorized))
    server = await asyncssh.create_server(
        _LoopbackServer,
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=str(authorized),
        process_factory=_run_with_bash,
        sftp_factory=True,
    )
    port = server.sockets[0].getsockname()[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode()}")
    return SSHHost(port, key_path, known_hosts, tmp_path / "remote"), server


@pytest.fixture
async def ssh_host(tmp_path: Path) -> AsyncIterator[SSHHost]:
    host, server = await start_ssh_host(tmp_path)
    yield host
    server.close()
    await server.wait_closed()


def _task(**args: object):  # type: ignore[no-untyped-def]
    return ENV.templates["count_letter"](**args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


async def test_ssh_runtime_serves_the_env_through_a_forwarded_port_and_release_stops_it(ssh_host):
    runtime = ssh_host.runtime()
    key = f"ssh-{uuid.uuid4().hex[:8]}"
    endpoint = await runtime.acquire(_task(), key)
    remote_dir = Path(endpoint.handle["dir"])
    pid = int((remote_dir / "pid").read_text())
    try:
        assert endpoint.url.startswith("tcp://127.0.0.1:")
        assert int(endpoint.url.rsplit(":", 1)[1]) != endpoint.handle["remote_port"]  # a forward
        assert (remote_dir / "token").stat().st_mode & 0o077 == 0
        assert (remote_dir / "token").read_text() == substrate_token(key)
        assert "token" not in endpoint.params
        assert _alive(pid) and os.getpgid(pid) == pid  # its own process group, survives us
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            await client.start_task("count_letter", {"word": "strawberry", "letter": "r"})
            assert (await client.grade("3"))["score"] == 1.0
    finally:
        await runtime.release(endpoint)
    for _ in range(50):
        if not _alive(pid):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pid) and not remote_dir.exists()
    await runtime.release(endpoint)  # idempotent


async def test_a_retried_acquire_in_a_fresh_process_reuses_the_remote_server(ssh_host):
    key = f"ssh-{uuid.uuid4().hex[:8]}"
    first = await ssh_host.runtime().acquire(_task(), key)
    try:
        ssh_module._FORWARDS.clear()  # a new worker process starts so (its forwards died)
        second = await ssh_host.runtime().acquire(_task(), key)
        assert second.handle["remote_port"] == first.handle["remote_port"]
        assert second.params == first.params and "token" not in second.params
        async with await connect(second.url, token=substrate_token(key)) as client:
            assert await client.start_task("count_letter", {})
    finally:
        await ssh_host.runtime().release(first)


async def test_a_remote_server_started_under_another_token_secret_is_restarted(
    ssh_host, monkeypatch
):
    """A worker with another secret cannot use the server: it starts its own under the key."""
    key = f"ssh-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("ROLLOUTS_TOKEN_SECRET", "host-a")
    first = await ssh_host.runtime().acquire(_task(), key)
    try:
        old_pid = int((Path(first.handle["dir"]) / "pid").read_text())
        ssh_module._FORWARDS.clear()
        monkeypatch.setenv("ROLLOUTS_TOKEN_SECRET", "host-b")
        second = await ssh_host.runtime().acquire(_task(), key)
        assert int((Path(second.handle["dir"]) / "pid").read_text()) != old_pid
        assert not _alive(old_pid)
        assert (Path(second.handle["dir"]) / "token").read_text() == substrate_token(key)
        async with await connect(second.url, token=substrate_token(key)) as client:
            assert await client.start_task("count_letter", {})
    finally:
        await ssh_host.runtime().release(first)


async def test_a_remote_python_without_the_package_gets_it_uploaded(ssh_host, tmp_path):
    # A Python that has pydantic but not durable_rollouts: the base interpreter plus a path
    # holding only pydantic and its dependencies.
    site = tmp_path / "only-pydantic"
    site.mkdir()
    import annotated_types
    import pydantic
    import pydantic_core
    import typing_extensions
    import typing_inspection

    for mod in (pydantic, pydantic_core, annotated_types, typing_inspection):
        (site / mod.__name__).symlink_to(Path(mod.__file__).parent)
    (site / "typing_extensions.py").symlink_to(typing_extensions.__file__)
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    wrapper = tmp_path / "python-without-package"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {base_python} -s "$@"\n'
    )
    wrapper.chmod(0o755)
    runtime = ssh_host.runtime(python=str(wrapper))
    key = f"ssh-{uuid.uuid4().hex[:8]}"
    endpoint = await runtime.acquire(_task(), key)
    try:
        uploaded = list((ssh_host.workdir / "pkg").glob("*/durable_rollouts/envserver/__main__.py"))
        assert len(uploaded) == 1
        async with await connect(endpoint.url, token=substrate_token(key)) as client:
            assert await client.start_task("count_letter", {})
    finally:
        await runtime.release(endpoint)


async def test_an_env_that_dies_while_loading_reports_its_last_log_lines(ssh_host, tmp_path):
    from durable_rollouts.models import Task

    task = Task(env="broken", id="x", source=str(ENV_IMAGE_DIR / "broken.py"))
    with pytest.raises(ProviderError) as info:
        await ssh_host.runtime().acquire(task, f"ssh-{uuid.uuid4().hex[:8]}")
    assert "exited" in str(info.value) and "broken-env: giving up on purpose" in str(info.value)


async def test_a_wrong_host_key_is_a_config_error(ssh_host, tmp_path):
    other = asyncssh.generate_private_key("ssh-ed25519")
    bad = tmp_path / "bad_known_hosts"
    bad.write_text(f"[127.0.0.1]:{ssh_host.port} {other.export_public_key().decode()}")
    runtime = SSHRuntime(
        "127.0.0.1",
        "root",
        str(ssh_host.key),
        port=ssh_host.port,
        known_hosts=str(bad),
        workdir=str(ssh_host.workdir),
    )
    with pytest.raises(ConfigError, match="refused"):
        await runtime.acquire(_task(), "ssh-badkey")


async def test_a_batch_of_rollouts_runs_through_the_direct_executor_on_ssh(ssh_host):
    tasks = [_task(word=w, letter="a") for w in ("banana", "papaya", "cat")]
    job = await run_direct(
        Taskset("ssh-batch", tasks),
        FixedAgent(answer="3"),
        ssh_host.runtime(),
        group=2,
        max_concurrent=6,
    )
    assert [r.error for r in job.runs] == [None] * 6
    assert sorted(r.reward for r in job.runs) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert not list((ssh_host.workdir / "substrates").iterdir())  # every server released
    assert not ssh_module._FORWARDS


def test_spec_round_trips_through_provider_from_spec():
    from durable_rollouts.runtimes import provider_from_spec

    runtime = SSHRuntime("h", "u", "/k", port=2222, workdir="/w", known_hosts="/kh", python="py")
    rebuilt = provider_from_spec(runtime.spec())
    assert isinstance(rebuilt, SSHRuntime) and rebuilt.spec() == runtime.spec()
    assert rebuilt.locality == "process"


def test_resources_ssh_cannot_honour_are_rejected_before_anything_starts():
    from durable_rollouts.models import RuntimeConfig

    task = _task().model_copy(update={"runtime_config": RuntimeConfig(resources={"cpu": 2})})
    with pytest.raises(ConfigError, match="resources.cpu"):
        SSHRuntime("h", "u", "/k").check_task(task)


async def test_a_durable_rollout_on_ssh_records_the_card_steps(ssh_host, tmp_path):
    from durable_shape import CARD, durable_shapes

    job, shapes = await durable_shapes(ssh_host.runtime(), [_task(word="banana", letter="a")],
                                       FixedAgent(answer="3"), tmp_path)
    assert [r.reward for r in job.runs] == [1.0], [r.error for r in job.runs]
    assert shapes == [CARD]
