"""DockerRuntime: a worker SIGKILLed between ``create`` and its answer leaves no orphan.

The worker talks to the real Docker engine through :class:`HoldingProxy`, a Unix-socket proxy
that passes every byte through except the answer to the first ``POST /containers/create``: the
engine has made the container, the worker never hears so. The test then SIGKILLs that worker. The
provision retried on a second worker finds the container by its key-derived name and adopts it.
Creations and removals are counted from the engine's own event log.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from dying_create import Lifetimes, lifetimes, run_with_a_dying_create
from substrates_support import ENV_IMAGE_DIR, KEY_LABEL, LoopThread

from durable_rollouts.envserver import load_environment
from durable_rollouts.runtimes.docker import DockerRuntime
from durable_rollouts.sdk.agents import FixedAgent

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ENGINE = "/var/run/docker.sock"
ENV = load_environment(str(ENV_IMAGE_DIR / "env.py"))


class HoldingProxy:
    """A Unix-socket proxy to the Docker engine that withholds the first create's answer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = False  # a create reached the engine and its answer is being withheld
        self._armed = True
        self._home = LoopThread()
        self._server = self._home.run(asyncio.start_unix_server(self._serve, str(path)))

    def close(self) -> None:
        self._server.close()
        self._home.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        engine_r, engine_w = await asyncio.open_unix_connection(ENGINE)
        hold = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self._armed and b"/containers/create" in data.split(b"\r\n", 1)[0]:
                    self._armed = False
                    hold.set()
                engine_w.write(data)
                await engine_w.drain()

        async def downstream() -> None:
            while data := await engine_r.read(65536):
                if hold.is_set():
                    self.held = True  # the engine answered: the container exists
                    await asyncio.Event().wait()  # ... and the worker never hears it
                client_w.write(data)
                await client_w.drain()

        pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            client_w.close()
            engine_w.close()


def _lifetimes(docker_client, since: float, job_id: str) -> Lifetimes:  # type: ignore[no-untyped-def]
    """The job's containers from the engine's own create and destroy events."""
    events = docker_client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                                  filters={"type": "container", "event": ["create", "destroy"]})
    ordered = sorted(events, key=lambda e: e["timeNano"])
    keyed = [(e["Action"], e["Actor"]["Attributes"].get(KEY_LABEL, "")) for e in ordered]
    return lifetimes(("made" if action == "create" else "gone", key) for action, key in keyed
                     if key.startswith(f"job-{job_id}"))


async def test_a_worker_killed_mid_create_leaves_one_container_per_rollout_and_none_after(
    docker_client, test_image, client, temporal_address, tmp_path
):
    proxy = HoldingProxy(tmp_path / "docker.sock")
    since = time.time()
    job_id = ""
    try:
        tasks = [ENV.templates["count_letter"](word=w, letter="a") for w in ("banana", "cat", "kayak")]
        done = await run_with_a_dying_create(
            client=client, address=temporal_address, runtime=DockerRuntime(test_image),
            tasks=tasks, agent=FixedAgent(answer="3"), create_held=lambda: proxy.held,
            env={"DOCKER_HOST": f"unix://{proxy.path}"})
        job_id = done.job.id
        assert [r.status for r in done.job.runs] == ["succeeded"] * 3, [r.error for r in done.job.runs]
        assert sorted(r.reward for r in done.job.runs) == [0.0, 0.0, 1.0]  # banana has 3
        seen = _lifetimes(docker_client, since, job_id)
        assert len(seen.made) == len(set(seen.made)) == 3  # the held one was adopted
        assert set(seen.most.values()) == {1}  # never two containers for one rollout
        assert seen.alive == 0
        assert [c for c in docker_client.containers.list(all=True, filters={"label": KEY_LABEL})
                if c.labels[KEY_LABEL].startswith(f"job-{job_id}")] == []
    finally:
        proxy.close()
        for c in docker_client.containers.list(all=True, filters={"label": KEY_LABEL}):
            if job_id and c.labels[KEY_LABEL].startswith(f"job-{job_id}"):
                c.remove(force=True)  # only when the test failed before teardown ran
