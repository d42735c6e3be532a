"""``Capability``'s named constructors and ``from_manifest``: HUD v6's binding shapes both ways.

``hud_0_6_21_bindings.json`` holds bindings recorded from the real ``hud`` 0.6.21 package by
``hud_probe.py`` (its constructors, and a HUD workspace env once it serves). The live test runs
that probe again when a Python with ``hud`` is at hand: this interpreter, or the one named by
``ROLLOUTS_TEST_HUD_PYTHON`` (hud pins a different fastmcp, so it usually lives in its own venv).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import FastMCP
from hud_probe import CASES

from durable_rollouts import Capability, Environment
from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import serving
from durable_rollouts.errors import ConfigError

HERE = Path(__file__).parent
RECORDED = json.loads((HERE / "hud_0_6_21_bindings.json").read_text())


def _ours(kind: str, args: dict[str, Any]) -> Capability:
    return getattr(Capability, kind)(**args)


def _hud_python() -> str | None:
    if importlib.util.find_spec("hud") is not None:
        return sys.executable
    return os.environ.get("ROLLOUTS_TEST_HUD_PYTHON") or None


def test_the_seeds_constructor_calls_publish_full_urls_with_hud_default_ports() -> None:
    screen = Capability.rfb(name="screen", url="rfb://127.0.0.1", display=0)
    assert screen.manifest() == {"name": "screen", "protocol": "rfb/3.8",
                                 "url": "rfb://127.0.0.1:5900", "params": {"display": 0}}
    assert Capability.rfb(name="s2", url="rfb://127.0.0.1", display=2).url == "rfb://127.0.0.1:5902"
    assert Capability.rfb(name="s", url="rfb://10.0.0.1:7000", display=2).url == "rfb://10.0.0.1:7000"
    tools = Capability.mcp(name="tools", url="http://127.0.0.1:8040/mcp")
    assert (tools.protocol, tools.params) == ("mcp/2025-11-25", {"transport": "streamable-http"})
    assert Capability.mcp(url="https://tools.example/mcp").url == "https://tools.example:443/mcp"
    assert Capability.mcp(url="127.0.0.1:8040/mcp").url == "http://127.0.0.1:8040/mcp"
    browser = Capability.cdp(name="browser", url="http://127.0.0.1:9222")
    assert (browser.protocol, browser.url, browser.params) == ("cdp/1.3", "http://127.0.0.1:9222", {})
    assert Capability.cdp(url="127.0.0.1").url == "ws://127.0.0.1:9222"
    arm = Capability.robot(name="arm", url="ws://127.0.0.1")
    assert (arm.protocol, arm.url, arm.params) == ("openpi/0", "ws://127.0.0.1:9091", {"contract": {}})
    shell = Capability.ssh(url="agent@127.0.0.1", host_pubkey="ssh-ed25519 AAAA", cwd="/w")
    assert shell.url == "ssh://agent@127.0.0.1:22"
    assert shell.params == {"user": "agent", "host_pubkey": "ssh-ed25519 AAAA", "shell": "bash",
                            "cwd": "/w"}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_our_constructors_build_the_binding_hud_0_6_21_builds(kind: str) -> None:
    assert _ours(kind, CASES[kind]).manifest() == RECORDED["constructed"][kind]


@pytest.mark.parametrize("capability", [
    Capability.ssh(url="ssh://127.0.0.1:2", host_pubkey="k", client_key="c", client_key_path="/k",
                   isolation="none", network=False, timeout_s=30.0, process_connections=True),
    Capability.mcp(url="https://h/mcp", auth_token="t", transport="sse"),
    Capability.mcp(url="wss://h/mcp"),
    Capability.cdp(url="ws://h:9222/devtools/page/1", target_id="1"),
    Capability.rfb(url="vnc://h", display=3, password="p"),
    Capability.robot(url="wss://h", contract={"features": {"joint": {"shape": [7]}}}),
    Capability(name="echo", protocol="tcp/1", url="tcp://127.0.0.1:9"),
], ids=lambda c: c.protocol)
def test_from_manifest_round_trips_every_constructor_also_through_json(capability: Capability) -> None:
    assert Capability.from_manifest(capability.manifest()) == capability
    assert Capability.from_manifest(json.loads(json.dumps(capability.to_manifest()))) == capability


@pytest.mark.parametrize("binding", [*RECORDED["constructed"].values(), *RECORDED["served"]],
                         ids=lambda b: b["protocol"])
def test_from_manifest_reads_the_bindings_a_hud_server_publishes_unchanged(binding: dict) -> None:
    assert Capability.from_manifest(binding).manifest() == binding
    assert Capability.from_manifest({**binding, "future_key": 1}).manifest() == binding
    assert Capability.from_manifest({**binding, "params": None}).params == {}


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Capability.from_manifest({"name": "x", "protocol": "gopher/1", "url": "gopher://h:7"}),
     "unknown protocol 'gopher/1' (known: cdp, filetracking, mcp, openpi, rfb, ssh, tcp)"),
    (lambda: Capability.from_manifest({"name": "x", "protocol": "ssh/2", "url": "http://h:22"}),
     "url 'http://h:22' must start with one of ssh://"),
    (lambda: Capability.from_manifest({"name": "x", "protocol": "ssh/2"}), "url must be a non-empty"),
    (lambda: Capability.from_manifest({"protocol": "ssh/2", "url": "ssh://h:22"}), "has no name"),
    (lambda: Capability.from_manifest({"name": "x", "protocol": "tcp", "url": "tcp://h:1",
                                       "params": [1]}), "params must be a dict"),
    (lambda: Capability.from_manifest(["shell"]), "must be a dict, not list"),
    (lambda: Capability.ssh(url="tcp://127.0.0.1:2", host_pubkey="k"), "must start with one of ssh://"),
    (lambda: Capability.mcp(url="stdio://server"), "must start with one of http://, https://"),
    (lambda: Capability.mcp(url="ws://h/mcp", transport="sse"), "needs a http:// or https:// url"),
    (lambda: Capability.mcp(url="http://h/mcp", transport="websocket"), "needs a ws:// or wss://"),
    (lambda: Capability.mcp(url="http://h:notaport/mcp"), "has a bad port"),
    (lambda: Capability.cdp(url="http:///json"), "names no host"),
    (lambda: Capability.rfb(url="rfb://h", display=-1), "display must be an int >= 0"),
])
def test_bad_capability_input_gets_one_clear_config_error(build: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


async def test_a_served_env_publishes_what_the_constructors_built_and_from_manifest_reads_it() -> None:
    tools = FastMCP("t")
    env = Environment(name="caps")
    env.mcp(tools, name="tools")
    env.add_capability(Capability.rfb(name="screen", url="rfb://127.0.0.1", display=1))
    env.add_capability(Capability.cdp(name="browser", url="http://127.0.0.1:9222"))
    async with serving(env) as server, await connect(server.url, keepalive_s=None) as client:
        published = {b["name"]: Capability.from_manifest(b) for b in client.bindings}
        assert published["screen"] == env.capability("screen")
        assert published["browser"] == env.capability("browser")
        assert published["tools"] == env.capability("tools")
        assert published["tools"].params == {"transport": "streamable-http"}


def test_hud_and_we_build_and_read_each_others_bindings_live() -> None:
    """Runs the real hud package: its constructors, its reading of ours, a served HUD workspace."""
    python = _hud_python()
    if python is None:
        pytest.skip("no Python with hud installed (set ROLLOUTS_TEST_HUD_PYTHON)")
    ours = [_ours(kind, args).manifest() for kind, args in CASES.items()]
    ours.append(Capability.ssh(url="ssh://agent@127.0.0.1:2", host_pubkey="k", client_key="c",
                               cwd="/workspace", isolation="bwrap", network=False,
                               timeout_s=300.0).manifest())  # our workspace's own params
    done = subprocess.run([python, str(HERE / "hud_probe.py")], input=json.dumps({"ours": ours}),
                          capture_output=True, text=True, timeout=120, cwd=HERE)
    assert done.returncode == 0, done.stderr[-2000:]
    hud = json.loads(done.stdout)
    assert hud["constructed"] == {kind: _ours(kind, args).manifest() for kind, args in CASES.items()}
    assert hud["read_ours"] == ours
    served = {b["name"]: b for b in hud["served"]}
    assert Capability.from_manifest(served["shell"]).manifest() == served["shell"]
    assert Capability.from_manifest(served["filetracking"]).protocol == "filetracking/1"
    assert served["shell"]["params"].keys() == RECORDED["served"][0]["params"].keys()
