"""moto's standalone S3 server (a real HTTP S3 API) for the storage tests and the outage cells.

``moto_server -H 127.0.0.1 -p PORT`` speaks the S3 REST API; aioboto3 talks to it through
``AWS_ENDPOINT_URL`` exactly as it would to AWS or MinIO.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["S3Server"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """``moto_server`` on a free loopback port; ``env(bucket)`` = the AWS_* variables for it."""

    def __init__(self, log: Path) -> None:
        exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not start: {log.read_text()}")

    def aws_env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def boto(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"rollouts-{uuid.uuid4().hex[:12]}"
        self.boto().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, int]:
        """key -> size of every object in ``bucket``."""
        out: dict[str, int] = {}
        for page in self.boto().get_paginator("list_objects_v2").paginate(Bucket=bucket):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
