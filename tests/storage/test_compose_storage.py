"""The compose stack's workers share an S3-compatible store (validated by ``docker-compose
config`` only: the images need a registry, the stack is not run here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from durable_rollouts.temporal.storage import parse_storage_url

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("docker-compose") is None,
                                reason="docker-compose is not installed")


def test_compose_workers_use_the_bundled_s3_store_through_aws_variables() -> None:
    """A MinIO service, a one-shot bucket creator, and workers with ROLLOUTS_STORAGE=s3://...
    whose AWS_ENDPOINT_URL names that service."""
    yaml = pytest.importorskip("yaml")
    out = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert {"minio", "minio-bucket", "worker"} <= set(services)
    env = services["worker"]["environment"]
    url = parse_storage_url(env["ROLLOUTS_STORAGE"])
    assert url.scheme == "s3" and url.bucket == "rollouts"
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert env["AWS_ACCESS_KEY_ID"] == services["minio"]["environment"]["MINIO_ROOT_USER"]
    assert "minio-bucket" in services["worker"]["depends_on"]
