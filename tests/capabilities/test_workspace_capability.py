"""The ssh workspace capability: real asyncssh, real bwrap, reached through ``tunnel.open``."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from durable_rollouts.client.capabilities import close_capability, open_capability
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.envserver import workspace as workspace_module
from durable_rollouts.envserver.workspace import Workspace, add_workspace
from durable_rollouts.errors import EnvError

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _env_with_hidden_files(tmp_path: Path) -> tuple[Environment, Path]:
    """An env whose own directory holds a hidden test, with a workspace next to it."""
    env_dir = tmp_path / "envdir"
    env_dir.mkdir()
    (env_dir / "hidden_test.py").write_text("SECRET = 'the hidden answer'\n")
    env = Environment(name="ws-test")
    env.source = str(env_dir / "env.py")
    env.workspace(tmp_path / "ws")
    return env, env_dir


async def _run(conn: asyncssh.SSHClientConnection, command: str) -> asyncssh.SSHCompletedProcess:
    return await conn.run(command, check=False)


@needs_bwrap
async def test_workspace_commands_run_in_the_sandbox_through_the_tunnel(tmp_path: Path) -> None:
    env, _ = _env_with_hidden_files(tmp_path)
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        binding = client.binding("shell")
        assert binding["protocol"] == "ssh/2"
        assert binding["params"]["isolation"] == "bwrap"
        assert binding["params"]["cwd"] == "/workspace"
        assert "PRIVATE KEY" in binding["params"]["client_key"]
        conn = await open_capability(client, "shell")
        try:
            result = await _run(conn, "pwd; echo hello > note.txt; cat note.txt; id -u")
        finally:
            await close_capability(conn)
    assert result.exit_status == 0, result.stderr
    assert result.stdout.split() == ["/workspace", "hello", "1000"]
    assert (tmp_path / "ws" / "note.txt").read_text() == "hello\n"


@needs_bwrap
async def test_sandbox_cannot_write_outside_the_workspace(tmp_path: Path) -> None:
    env, env_dir = _env_with_hidden_files(tmp_path)
    targets = ["/escape.txt", "/etc/escape.txt", "/usr/escape.txt", str(env_dir / "escape.txt"),
               str(tmp_path / "escape.txt")]
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        conn = await open_capability(client, "shell")
        try:
            results = {t: await _run(conn, f"echo pwned > {t}") for t in targets}
            tmp_write = await _run(conn, "echo scratch > /tmp/h6-scratch && cat /tmp/h6-scratch")
        finally:
            await close_capability(conn)
    for target, result in results.items():
        assert result.exit_status != 0, f"writing {target} succeeded"
        assert not Path(target).exists()
    assert tmp_write.exit_status == 0 and tmp_write.stdout == "scratch\n"
    assert not Path("/tmp/h6-scratch").exists()  # the sandbox's /tmp is its own


@needs_bwrap
async def test_sandbox_cannot_read_the_environments_hidden_files(tmp_path: Path) -> None:
    env, env_dir = _env_with_hidden_files(tmp_path)
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        conn = await open_capability(client, "shell")
        try:
            hidden = await _run(conn, f"cat {env_dir / 'hidden_test.py'}")
            this_file = await _run(conn, f"cat {Path(__file__).resolve()}")
            listing = await _run(conn, "ls /")
        finally:
            await close_capability(conn)
    assert hidden.exit_status != 0 and "hidden answer" not in hidden.stdout
    assert this_file.exit_status != 0 and this_file.stdout == ""
    visible = set(listing.stdout.split())
    assert "workspace" in visible and "usr" in visible
    assert not visible & {"work", "root", "home", "opt", "srv", "mnt"}


async def _listener() -> tuple[asyncio.Server, int, list[int]]:
    hits: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(1)
        writer.write(b"reached\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], hits


_DIAL = ("python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=3); "
         "print(s.recv(100).decode().strip())\"")


@needs_bwrap
async def test_sandbox_has_no_network_unless_asked(tmp_path: Path) -> None:
    listener, port, hits = await _listener()
    try:
        results: dict[object, Any] = {}
        for network in (False, True):
            env = Environment(name=f"net-{network}")
            add_workspace(env, tmp_path / f"ws-{network}", network=network)
            async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
                conn = await open_capability(client, "shell")
                try:
                    results[network] = await _run(conn, _DIAL.format(port=port))
                    if not network:  # nor through ssh port forwarding
                        with pytest.raises(asyncssh.ChannelOpenError):
                            await conn.open_connection("127.0.0.1", port)
                        results["forward"] = True
                finally:
                    await close_capability(conn)
    finally:
        listener.close()
    assert results[False].exit_status != 0
    assert "reached" not in results[False].stdout
    assert results["forward"] is True
    assert results[True].exit_status == 0 and results[True].stdout.strip() == "reached"
    assert len(hits) == 1  # only the network=True sandbox got through


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(pid))
    return found


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_a_command_past_its_timeout_is_killed(tmp_path: Path, isolation: str) -> None:
    if isolation == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    env = Environment(name="timeout")
    add_workspace(env, tmp_path / "ws", timeout_s=1.0, isolation=isolation)  # type: ignore[arg-type]
    marker = f"31.{random.randrange(10**8):08d}"  # unique: never another run's leftover
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        conn = await open_capability(client, "shell")
        try:
            began = time.monotonic()
            result = await _run(conn, f"sleep {marker}; echo late > late.txt")
            elapsed = time.monotonic() - began
            after = await _run(conn, "echo still usable")
        finally:
            await close_capability(conn)
    assert result.exit_status == workspace_module.TIMEOUT_EXIT_STATUS
    assert "timeout" in result.stderr
    assert elapsed < 5
    assert after.stdout == "still usable\n"
    assert not (tmp_path / "ws" / "late.txt").exists()
    await asyncio.sleep(0.1)
    assert _processes_with(marker) == []


@needs_bwrap
async def test_a_foreign_client_key_is_rejected(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    cap = await ws.start()
    try:
        port = int(cap.url.rsplit(":", 1)[1])
        stranger = asyncssh.generate_private_key("ssh-ed25519")
        with pytest.raises(asyncssh.PermissionDenied):
            await asyncssh.connect("127.0.0.1", port, username="agent", client_keys=[stranger],
                                   known_hosts=None, config=None, agent_path=None)
    finally:
        await ws.stop()


async def test_without_bwrap_the_workspace_refuses_commands_naming_the_opt_out_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No bwrap on PATH (a machine without bubblewrap): every command gets one line naming
    bubblewrap and isolation="none", exit 126, and nothing runs; graders get the same refusal."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bwrap-here"))
    monkeypatch.delenv("ROLLOUTS_WORKSPACE_ISOLATION", raising=False)
    monkeypatch.setattr(workspace_module, "_warned_no_bwrap", False)
    caplog.set_level(logging.WARNING, logger=workspace_module.__name__)
    spaces = [Workspace(tmp_path / f"ws{i}") for i in range(2)]
    caps = [await ws.start() for ws in spaces]
    try:
        assert [c.params["isolation"] for c in caps] == ["refused", "refused"]
        warnings = [r for r in caplog.records if "REFUSED" in r.getMessage()]
        assert len(warnings) == 1
        env = Environment(name="plain")
        env.add_capability(caps[0])
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            conn = await open_capability(client, "shell")
            try:
                result = await _run(conn, "echo x > made.txt")
            finally:
                await close_capability(conn)
        assert result.exit_status == workspace_module.REFUSED_EXIT_STATUS
        line = result.stderr.strip()
        assert "\n" not in line and "bubblewrap" in line and 'isolation="none"' in line
        assert "ROLLOUTS_WORKSPACE_ISOLATION=none" in line and "bwrap is not installed" in line
        assert not (tmp_path / "ws0" / "made.txt").exists()
        with pytest.raises(EnvError, match="bubblewrap"):
            spaces[0].shell_command("true")
    finally:
        for ws in spaces:
            await ws.stop()


@needs_bwrap
async def test_a_bwrap_that_cannot_make_namespaces_gets_the_refusal_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real bwrap, run inside a user namespace it cannot map (as on a host without
    unprivileged user namespaces): the probe fails, commands are refused with bwrap's words."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("unshare")} --user {shutil.which("bwrap")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ROLLOUTS_WORKSPACE_ISOLATION", raising=False)
    ws = Workspace(tmp_path / "ws")
    cap = await ws.start()
    try:
        assert cap.params["isolation"] == "refused"
        env = Environment(name="plain")
        env.add_capability(cap)
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            conn = await open_capability(client, "shell")
            try:
                result = await _run(conn, "echo x > made.txt")
            finally:
                await close_capability(conn)
        assert result.exit_status == workspace_module.REFUSED_EXIT_STATUS
        assert "bwrap does not work here" in result.stderr and "namespace" in result.stderr
        assert 'isolation="none"' in result.stderr
        assert not (tmp_path / "ws" / "made.txt").exists()
    finally:
        await ws.stop()


@pytest.mark.parametrize("asked_by", ["env", "operator"])
async def test_without_bwrap_commands_run_unsandboxed_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked_by: str
) -> None:
    """``isolation="none"`` from the env, or ROLLOUTS_WORKSPACE_ISOLATION=none from the operator
    for a workspace left at auto: commands run in the real directory and the binding says so."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bwrap-here"))
    if asked_by == "operator":
        monkeypatch.setenv("ROLLOUTS_WORKSPACE_ISOLATION", "none")
        ws = Workspace(tmp_path / "ws0")
    else:
        monkeypatch.delenv("ROLLOUTS_WORKSPACE_ISOLATION", raising=False)
        ws = Workspace(tmp_path / "ws0", isolation="none")
    cap = await ws.start()
    try:
        assert cap.params["isolation"] == "none"
        assert cap.params["cwd"] == str(tmp_path / "ws0")
        env = Environment(name="plain")
        env.add_capability(cap)
        async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
            conn = await open_capability(client, "shell")
            try:
                result = await _run(conn, "pwd; echo x > made.txt; echo ${OPENAI_API_KEY:-unset}")
            finally:
                await close_capability(conn)
        assert result.stdout.split()[0] == str(tmp_path / "ws0")
        assert result.stdout.split()[1] == "unset"  # the server's environment never leaks in
        assert (tmp_path / "ws0" / "made.txt").exists()
    finally:
        await ws.stop()


@needs_bwrap
async def test_the_operator_setting_applies_only_to_workspaces_left_at_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUTS_WORKSPACE_ISOLATION", "none")
    left, strict = Workspace(tmp_path / "a"), Workspace(tmp_path / "b", isolation="bwrap")
    try:
        assert (await left.start()).params["isolation"] == "none"
        assert (await strict.start()).params["isolation"] == "bwrap"
    finally:
        await left.stop()
        await strict.stop()


async def test_requiring_bwrap_without_it_fails_naming_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    env = Environment(name="strict")
    add_workspace(env, tmp_path / "ws", name="strictshell", isolation="bwrap")
    with pytest.raises(EnvError, match="strictshell"):
        async with serving(env):
            pass


async def test_nothing_touches_disk_until_the_env_serves(tmp_path: Path) -> None:
    root = tmp_path / "later" / "ws"
    env = Environment(name="lazy")
    ws = add_workspace(env, root)
    temp_env = Environment(name="lazy-temp")
    temp_ws = add_workspace(temp_env, None)
    assert not root.exists() and temp_ws.root is None
    assert env.capabilities == []
    async with serving(env), serving(temp_env):
        assert root.is_dir()
        temp_root = temp_ws.root
        assert temp_root is not None and temp_root.is_dir()
        assert env.capability("shell").params["client_key"]
    assert ws.capability is None
    assert not temp_root.exists()  # a temporary root goes away with the env


@needs_bwrap
async def test_a_command_dies_with_its_ssh_session(tmp_path: Path) -> None:
    env = Environment(name="hangup")
    env.workspace(tmp_path / "ws", timeout_s=60)
    marker = f"27.{random.randrange(10**8):08d}"  # unique: never another run's leftover
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        conn = await open_capability(client, "shell")
        process = await conn.create_process(f"sleep {marker}")
        for _ in range(100):
            if _processes_with(marker):
                break
            await asyncio.sleep(0.02)
        assert _processes_with(marker), "the command never started"
        process.close()
        await close_capability(conn)
        for _ in range(100):
            if not _processes_with(marker):
                break
            await asyncio.sleep(0.02)
        assert _processes_with(marker) == []  # gone while the env still serves


@needs_bwrap
async def test_extra_mounts_and_hidden_system_paths(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    (data / "input.txt").write_text("shared data\n")
    env = Environment(name="mounts")
    env.workspace(tmp_path / "ws", mounts=[f"{data}:/data", f"{out}:/out:rw"], hide=["/etc/ssl"])
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        conn = await open_capability(client, "shell")
        try:
            read = await _run(conn, "cat /data/input.txt")
            write_ro = await _run(conn, "echo x > /data/new.txt")
            write_rw = await _run(conn, "echo result > /out/result.txt")
            hidden = await _run(conn, "ls -A /etc/ssl | wc -l")
        finally:
            await close_capability(conn)
    assert read.stdout == "shared data\n"
    assert write_ro.exit_status != 0 and not (data / "new.txt").exists()
    assert write_rw.exit_status == 0 and (out / "result.txt").read_text() == "result\n"
    assert any(Path("/etc/ssl").iterdir()) and hidden.stdout.strip() == "0"


@needs_bwrap
async def test_a_missing_mount_source_fails_instead_of_disabling_the_sandbox(tmp_path: Path) -> None:
    env = Environment(name="typo")
    env.workspace(tmp_path / "ws", name="typoshell", mounts=[f"{tmp_path / 'nope'}:/data"])
    with pytest.raises(EnvError, match="typoshell.*does not exist"):
        async with serving(env):
            pass
