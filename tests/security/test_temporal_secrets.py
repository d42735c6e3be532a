"""Secrets stay out of everything a durable batch leaves behind, on a real Temporal dev server.

1. An agent whose config only *names* its API key env var (the value lives in the worker's
   environment) runs a batch against an env served with a token: the key value appears in no
   workflow history (raw protobuf of every event of every workflow of the job, so search
   attributes and memos too), no exported JSONL (SDK and ``rollouts export``), no file under
   ``$ROLLOUTS_HOME`` (trace store, result chunks) and no captured log line. The fake model
   server checks that the key did reach the agent.
2. With ``ROLLOUTS_PAYLOAD_KEY`` set, workflow histories hold no plaintext of a task argument
   (or of the env token a borrowed runtime carries), and the batch still completes; without the
   key the same scan does find the argument, so the scan is known to see plaintext.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from history_scan import job_histories
from security_helpers import make_env
from temporal_helpers import DevServer

from durable_rollouts.envserver import serving
from durable_rollouts.models import Task
from durable_rollouts.paths import rollouts_home
from durable_rollouts.runtimes import Runtime
from durable_rollouts.sdk.openai_agent import OpenAIChatAgent
from durable_rollouts.sdk.taskset import Taskset
from durable_rollouts.temporal.batches import run_taskset, shutdown_embedded
from durable_rollouts.temporal.codec import KEY_ENV_VAR
from durable_rollouts.temporal.connection import connect_client

API_KEY = "sk-test-SECRET123"
ENV_TOKEN = "env-token-SECRET456"


@pytest.fixture(scope="module")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = DevServer(tmp_path_factory.mktemp("temporal-sec") / "t.db")
    server.start()
    yield server.address
    server.stop()


class FakeModel:
    """An OpenAI-compatible /chat/completions endpoint that answers the word in the prompt."""

    def __init__(self) -> None:
        self.authorizations: list[str] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeModel:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)}
        body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
        self.authorizations.append(headers.get("authorization", ""))
        prompt = body["messages"][-1]["content"]
        reply = json.dumps({
            "choices": [{"message": {"role": "assistant", "content": prompt.split()[-1]}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(reply)).encode() + b"\r\n\r\n" + reply)
        await writer.drain()
        writer.close()



def _files_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


async def _run_batch(address: str, task_args: list[dict[str, Any]], agent: Any, *, token: str | None) -> tuple[Any, Any]:
    client = await connect_client(address)
    async with serving(make_env(), token=token) as env_server:
        tasks = [Task(env="secenv", id="secret", args=args) for args in task_args]
        params = {"token": token} if token else {}
        job = await run_taskset(Taskset("secrets", tasks), agent, runtime=Runtime(env_server.url, params),
                                temporal=client, worker=True, task_queue=f"sec-{uuid.uuid4().hex[:8]}")
    return client, job


async def test_an_api_key_from_the_worker_env_never_reaches_history_exports_files_or_logs(
    temporal_address: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    caplog.set_level(logging.DEBUG)
    try:
        async with FakeModel() as model:
            agent = OpenAIChatAgent(model="fake", base_url=model.base_url, api_key_env="OPENAI_API_KEY")
            client, job = await _run_batch(temporal_address, [{"word": "alpha"}, {"word": "beta"}], agent,
                                           token=ENV_TOKEN)
        assert [r.status for r in job.runs] == ["succeeded", "succeeded"], [r.error for r in job.runs]
        assert [r.reward for r in job.runs] == [1.0, 1.0]
        assert model.authorizations == [f"Bearer {API_KEY}"] * 2  # the worker did use the key

        secret = API_KEY.encode()
        assert secret not in await job_histories(client, job)
        assert secret not in job.to_jsonl(tmp_path / "sdk.jsonl").read_bytes()
        export = subprocess.run(
            [sys.executable, "-m", "durable_rollouts.cli", "export", job.id, "-o", str(tmp_path / "cli.jsonl"),
             "--temporal", temporal_address],
            capture_output=True, timeout=60, env={**os.environ, "OPENAI_API_KEY": ""},
        )
        assert export.returncode == 0, export.stderr.decode()[-2000:]
        assert (tmp_path / "cli.jsonl").read_bytes().count(b"\n") == 2
        assert secret not in (tmp_path / "cli.jsonl").read_bytes() + export.stdout + export.stderr
        assert secret not in _files_under(rollouts_home())  # trace store, result chunks, substrates
        assert API_KEY not in caplog.text
        out, err = capfd.readouterr()
        assert API_KEY not in out + err
    finally:
        await shutdown_embedded()


async def test_with_a_payload_key_histories_hold_no_plaintext_and_the_batch_completes(
    temporal_address: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durable_rollouts.sdk.agents import TableAgent

    marker = f"plaintext-marker-{uuid.uuid4().hex[:8]}"
    agent = TableAgent(answers={"secret": marker})
    try:
        monkeypatch.delenv(KEY_ENV_VAR, raising=False)
        client, job = await _run_batch(temporal_address, [{"word": marker}], agent, token=ENV_TOKEN)
        assert [r.reward for r in job.runs] == [1.0]
        plain = await job_histories(client, job)
        assert marker.encode() in plain and ENV_TOKEN.encode() in plain  # the scan sees plaintext
        await shutdown_embedded()

        monkeypatch.setenv(KEY_ENV_VAR, base64.b64encode(os.urandom(32)).decode())
        client, job = await _run_batch(temporal_address, [{"word": marker}], agent, token=ENV_TOKEN)
        assert [r.status for r in job.runs] == ["succeeded"] and [r.reward for r in job.runs] == [1.0]
        sealed = await job_histories(client, job)
        assert b"binary/encrypted" in sealed
        assert marker.encode() not in sealed and ENV_TOKEN.encode() not in sealed
    finally:
        await shutdown_embedded()
