"""Run by a Python that has HUD v6 (``hud`` 0.6.21) installed, not by pytest.

``CASES`` (importable without HUD) are the constructor arguments both sides are compared on.
Reads ``{"ours": [binding, ...]}`` on stdin and prints, as JSON: the bindings HUD's own named
constructors build for the arguments in ``CASES`` (``constructed``), each of our bindings as HUD's
``Capability.from_manifest`` reads it back (``read_ours``), and the bindings a HUD environment with
a workspace publishes in ``hello`` once it serves (``served``; private keys blanked).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile

CASES = {
    "ssh": {"url": "ssh://127.0.0.1:2222", "host_pubkey": "ssh-ed25519 AAAAhost",
            "client_key": "KEY", "cwd": "/workspace", "isolation": "bwrap"},
    "mcp": {"name": "tools", "url": "http://127.0.0.1:8040/mcp"},
    "cdp": {"name": "browser", "url": "http://127.0.0.1:9222"},
    "rfb": {"name": "screen", "url": "rfb://127.0.0.1", "display": 1},
    "robot": {"name": "arm", "url": "ws://127.0.0.1", "contract": {"robot_type": "aloha"}},
}


async def served() -> list[dict]:
    from hud import Environment

    env = Environment("probe")
    env.workspace(tempfile.mkdtemp(), track_files=True)
    await env.start()
    bindings = [c.to_manifest() for c in env.capabilities]
    for binding in bindings:
        if "client_key" in binding["params"]:
            binding["params"]["client_key"] = "<private key>"
    return bindings


def main() -> None:
    from hud.capabilities import Capability

    ours = json.load(sys.stdin)["ours"]
    print(json.dumps({
        "constructed": {kind: getattr(Capability, kind)(**args).to_manifest()
                        for kind, args in CASES.items()},
        "read_ours": [Capability.from_manifest(b).to_manifest() for b in ours],
        "served": asyncio.run(served()),
    }))


if __name__ == "__main__":
    main()
