"""``--storage`` for the benchmarks: the file driver, any URL, or ``moto`` (a local moto S3
server started for the run), and the bytes a job keeps in history vs in storage.

    python benchmarks/bench_scale.py --n 500 --storage moto
    python benchmarks/bench_overhead.py --storage file        # the default store
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def add_storage_option(parser: Any) -> None:
    parser.add_argument("--storage", default="file",
                        help="file (file://$ROLLOUTS_HOME/storage), moto (a local moto S3 server), "
                             "or a ROLLOUTS_STORAGE url (s3://..., with the AWS_* variables)")


@contextmanager
def use_storage(value: str, home: Path) -> Iterator[str]:
    """Set ROLLOUTS_STORAGE for the run (starting moto for ``moto``); yields the url."""
    proc = None
    if value == "moto":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        log = open(home / "moto.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        _s3().create_bucket(Bucket=bucket)
        value = f"s3://{bucket}/bench"
    elif value == "file":
        value = f"file://{home / 'storage'}"
    os.environ["ROLLOUTS_STORAGE"] = value
    try:
        yield value
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)


def _s3() -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))


def storage_bytes(url: str) -> tuple[int, int]:
    """(objects, bytes) in the store."""
    from durable_rollouts.temporal.storage import parse_storage_url

    parsed = parse_storage_url(url)
    if parsed.scheme == "file":
        files = [p for p in Path(parsed.path).rglob("*") if p.is_file()]
        return len(files), sum(p.stat().st_size for p in files)
    count = size = 0
    for page in _s3().get_paginator("list_objects_v2").paginate(Bucket=parsed.bucket,
                                                               Prefix=parsed.prefix):
        for obj in page.get("Contents", []):
            count, size = count + 1, size + obj["Size"]
    return count, size


async def history_bytes(client: Any, job_id: str, sample: int = 0) -> dict[str, int]:
    """Events and bytes of events in the histories of ``job_id``: every TasksetRun run, and the
    Rollout children (all, or ``sample`` of them scaled up to the total)."""
    parents: list[Any] = []
    children: list[Any] = []
    total_children = 0
    async for wf in client.list_workflows(f'RolloutsJobId = "{job_id}"'):
        if wf.workflow_type == "TasksetRun":
            parents.append(wf)
        else:
            total_children += 1
            if not sample or len(children) < sample:
                children.append(wf)

    async def measure(wfs: list[Any]) -> tuple[int, int]:
        events = size = 0
        for wf in wfs:
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
            events += len(history.events)
            size += sum(e.ByteSize() for e in history.events)
        return events, size

    p_events, p_bytes = await measure(parents)
    c_events, c_bytes = await measure(children)
    scale = total_children / len(children) if children else 0.0
    return {"taskset_runs": len(parents), "parent_events": p_events, "parent_bytes": p_bytes,
            "children": total_children, "child_events": int(c_events * scale),
            "child_bytes": int(c_bytes * scale), "bytes": p_bytes + int(c_bytes * scale)}
