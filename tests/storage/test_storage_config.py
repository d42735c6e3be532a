"""ROLLOUTS_STORAGE: parsing, the drivers it builds, the start-up probe, and encryption at rest.

The S3 cases run against moto's standalone server (a real HTTP S3 API on 127.0.0.1). The GCS
driver cannot be reached from here: only its URL parsing and construction are tested.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.contrib.aws.s3driver import S3StorageDriver
from temporalio.contrib.gcp.gcsdriver import GCSStorageDriver

from durable_rollouts.temporal.codec import KEY_ENV_VAR, data_converter
from durable_rollouts.errors import ConfigError
from durable_rollouts.temporal import storage
from durable_rollouts.temporal.storage_clients import GCSClient, S3Client

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("value", "scheme", "bucket", "prefix", "path"), [
    ("file:///var/lib/rollouts", "file", "", "", "/var/lib/rollouts"),
    ("s3://my-bucket", "s3", "my-bucket", "", ""),
    ("s3://my-bucket/team/a/", "s3", "my-bucket", "team/a/", ""),
    ("gs://g-bucket/p", "gs", "g-bucket", "p/", ""),
])
def test_storage_urls_name_a_scheme_bucket_and_prefix(value, scheme, bucket, prefix, path) -> None:
    """file://PATH, s3://BUCKET/PREFIX and gs://BUCKET/PREFIX parse; a prefix always ends in /."""
    assert storage.parse_storage_url(value) == storage.StorageURL(scheme, bucket, prefix, path)


@pytest.mark.parametrize("value", ["ftp://x/y", "s3:///nobucket", "file://relative/path", "bucket"])
def test_a_malformed_storage_url_is_a_config_error(value: str) -> None:
    """Anything else is one ConfigError naming ROLLOUTS_STORAGE."""
    with pytest.raises(ConfigError, match="ROLLOUTS_STORAGE"):
        storage.parse_storage_url(value)


def test_the_default_store_is_a_file_driver_under_rollouts_home(monkeypatch, tmp_path) -> None:
    """No ROLLOUTS_STORAGE: the converter offloads to $ROLLOUTS_HOME/storage."""
    monkeypatch.delenv("ROLLOUTS_STORAGE", raising=False)
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path))
    ext = data_converter().external_storage
    assert ext is not None and isinstance(ext.drivers[0], storage.FileStorageDriver)
    assert ext.drivers[0].root == tmp_path / "storage"
    assert ext.payload_size_threshold == 256 * 1024


def test_s3_and_gcs_urls_build_temporalios_drivers() -> None:
    """s3:// -> temporalio's S3StorageDriver, gs:// -> its GCSStorageDriver (construction only:
    no GCS endpoint exists here), each with the URL's prefix on its client."""
    s3 = storage.build_driver(storage.parse_storage_url("s3://b-1/pre"))
    gcs = storage.build_driver(storage.parse_storage_url("gs://b-2/pre/x"))
    assert isinstance(s3, S3StorageDriver) and s3.name() == "aws.s3driver"
    assert isinstance(s3._client, S3Client) and s3._client.prefix == "pre/"
    assert isinstance(gcs, GCSStorageDriver) and gcs.name() == "gcp.gcsdriver"
    assert isinstance(gcs._client, GCSClient) and gcs._client.prefix == "pre/x/"


def test_the_file_driver_rejects_a_tampered_object(tmp_path: Path) -> None:
    """Objects are named by their SHA-256: altered bytes are an error, never a wrong payload."""
    blobs = storage.Blobs(storage.FileStorageDriver(tmp_path), use_env_codec=False)
    uri = blobs.put(b"the trace")
    assert blobs.get(uri) == b"the trace"
    (obj,) = [p for p in tmp_path.rglob("*") if p.is_file()]
    obj.write_bytes(obj.read_bytes().replace(b"the trace", b"the TRACE"))
    with pytest.raises(ValueError, match="integrity"):
        blobs.get(uri)


async def test_large_payloads_go_to_the_bucket_and_small_ones_stay_inline(s3_storage, s3_server) -> None:
    """Through the data converter: a 3 MB value becomes a reference in history, its bytes an
    object under the URL's prefix; a small value stays inline; both decode back."""
    _, bucket = s3_storage
    converter = data_converter()
    big, small = "x" * 3_000_000, "hello"
    payloads = await converter.encode([big, small])
    assert payloads[0].ByteSize() < 2_000 and payloads[1].data == b'"hello"'
    objects = s3_server.objects(bucket)
    assert any(k.startswith("jobs/v0/") and size > 3_000_000 for k, size in objects.items())
    assert await converter.decode(payloads, [str, str]) == [big, small]


async def test_with_a_payload_key_the_bucket_holds_only_ciphertext(s3_storage, s3_server, monkeypatch) -> None:
    """Encrypt, then offload: no stored object (converter payloads or blobs) contains the
    plaintext, and both read back with the key."""
    _, bucket = s3_storage
    monkeypatch.setenv(KEY_ENV_VAR, base64.b64encode(os.urandom(32)).decode())
    secret = "sk-SECRET-" + "y" * 400_000
    converter = data_converter()
    payloads = await converter.encode([secret])
    uri = storage.blobs().put(b"trace with sk-SECRET-token")
    for key in s3_server.objects(bucket):
        body = s3_server.boto().get_object(Bucket=bucket, Key=key)["Body"].read()
        assert b"sk-SECRET" not in body, key
    assert await converter.decode(payloads, [str]) == [secret]
    assert storage.blobs().get(uri) == b"trace with sk-SECRET-token"


async def test_the_probe_names_a_missing_bucket_and_an_unreachable_endpoint(s3_server, monkeypatch) -> None:
    """Start-up probe: a missing bucket or a dead endpoint is one ConfigError line."""
    for key, value in s3_server.aws_env().items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match="NoSuchBucket"):
        await storage.probe("s3://no-such-bucket-here/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
    with pytest.raises(ConfigError, match="not usable: EndpointConnectionError"):
        await storage.probe("s3://any-bucket-name/x")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "durable_rollouts.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["jobs"], ["show", "nojob"], ["export", "nojob", "-o", "-"],
                                     ["worker"]])
def test_bad_storage_is_one_error_line_and_exit_2_before_anything_starts(
        command: list[str], s3_server, tmp_path: Path) -> None:
    """A missing bucket (--storage or ROLLOUTS_STORAGE), an unreachable endpoint or a bad URL:
    exit 2, one ``error:`` line, and no embedded Temporal server was started."""
    home = tmp_path / "home"
    env = {**s3_server.aws_env(), "ROLLOUTS_HOME": str(home)}
    env.pop("ROLLOUTS_TEMPORAL_ADDRESS", None)
    cases = [
        (command + ["--storage", "s3://no-such-bucket-here/p"], env, "NoSuchBucket"),
        (command, {**env, "ROLLOUTS_STORAGE": "s3://no-such-bucket-here/p"}, "NoSuchBucket"),
        (command + ["--storage", "s3://some-bucket/p"], {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
         "EndpointConnectionError"),
        (command, {**env, "ROLLOUTS_STORAGE": "ftp://nowhere"}, "ROLLOUTS_STORAGE"),
    ]
    for args, case_env, expected in cases:
        out = _cli(args, case_env)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr
        assert not (home / "temporal.json").exists(), "a Temporal server was started"


def test_every_command_that_connects_offers_storage() -> None:
    """--storage is on run, worker, resume, show, trace, export, jobs, cancel and gc."""
    for command in ["run", "worker", "resume", "show", "trace", "export", "jobs", "cancel", "gc"]:
        out = _cli([command, "--help"], {"COLUMNS": "200"})
        assert "--storage" in out.stdout, command


def test_payload_over_the_threshold_round_trips_through_the_file_driver(tmp_path, monkeypatch) -> None:
    """ROLLOUTS_STORAGE_THRESHOLD lowers the bar; the file driver stores and returns the bytes."""
    monkeypatch.setenv("ROLLOUTS_STORAGE", f"file://{tmp_path}/st")
    monkeypatch.setenv("ROLLOUTS_STORAGE_THRESHOLD", "100")
    converter = data_converter()

    async def go() -> None:
        (ref,) = await converter.encode(["z" * 1000])
        assert b"z" * 1000 not in ref.SerializeToString()
        assert await converter.decode([ref], [str]) == ["z" * 1000]

    asyncio.run(go())
    assert [p for p in (tmp_path / "st").rglob("*") if p.is_file()]
