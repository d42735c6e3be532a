"""Fixtures of the storage tests: a real S3 API (moto's standalone server) and the Temporal tests'
dev server (``tests/temporal/conftest.py``, loaded under another module name and re-exported).

``moto_server -H 127.0.0.1 -p PORT`` is a real HTTP server speaking the S3 REST API; aioboto3
talks to it through ``AWS_ENDPOINT_URL`` exactly as it would to AWS or MinIO.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto_s3 import S3Server

_TEMPORAL = Path(__file__).resolve().parent.parent / "temporal"

_spec = importlib.util.spec_from_file_location("temporal_conftest_storage", _TEMPORAL / "conftest.py")
assert _spec is not None and _spec.loader is not None
temporal_conftest = importlib.util.module_from_spec(_spec)
sys.modules["temporal_conftest_storage"] = temporal_conftest
_spec.loader.exec_module(temporal_conftest)

dev_server = temporal_conftest.dev_server
client = temporal_conftest.client
task_queue = temporal_conftest.task_queue


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3_storage(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A fresh bucket; this process's ROLLOUTS_STORAGE and AWS_* point at it. -> (url, bucket)."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/jobs"
    for key, value in s3_server.aws_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ROLLOUTS_STORAGE", url)
    yield url, bucket
    os.environ.pop("ROLLOUTS_STORAGE", None)
