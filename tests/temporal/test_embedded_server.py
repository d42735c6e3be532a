"""The embedded dev server: started once per ROLLOUTS_HOME, reused, never confused with another's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from durable_rollouts.processes import pid_alive
from durable_rollouts.temporal.connection import ensure_dev_server, stop_dev_server


async def test_two_homes_starting_at_once_get_their_own_servers(tmp_path: Path) -> None:
    """Both may race for the default port; the loser must notice and move, not adopt the winner."""
    homes = [tmp_path / "a", tmp_path / "b"]
    try:
        first, second = await asyncio.gather(*(ensure_dev_server(h, ui=False) for h in homes))
        assert first.pid != second.pid
        assert first.port != second.port
        assert pid_alive(first.pid) and pid_alive(second.pid)
        again = await ensure_dev_server(homes[0], ui=False)
        assert again.pid == first.pid  # reused, not restarted
    finally:
        for home in homes:
            stop_dev_server(home)
