"""A remote store that is briefly unreachable is waited out; a refusal is not (no Temporal here).

``temporal.storage.patiently`` retries a blob read or write while the S3/GCS driver reports a
connection failure or a 5xx, for up to ``ROLLOUTS_STORAGE_PATIENCE`` seconds; a missing object,
an access denial or bad data fails at once. The 30 s bucket outage itself is a cell of the fault
matrix (tests/storage/test_outages.py).
"""

from __future__ import annotations

import time

import pytest

from durable_rollouts.temporal.storage import patiently, unreachable


def _driver_error(cause: BaseException) -> RuntimeError:
    """What the S3 driver raises: RuntimeError("... failed") from the client's error."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise RuntimeError("S3StorageDriver store failed [bucket=b, key=k]") from exc
    except RuntimeError as err:
        return err


async def test_a_refused_connection_is_retried_until_the_store_answers(monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_STORAGE_PATIENCE", "10")
    calls = []

    async def put() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise _driver_error(ConnectionRefusedError(111, "Connection refused"))
        return "rollouts-storage:s3?key=k"

    assert await patiently(put) == "rollouts-storage:s3?key=k"
    assert len(calls) == 3 and calls[2] - calls[0] >= 1.4  # 0.5 s, then 1 s apart


async def test_a_refusal_fails_at_once_and_an_outage_past_the_patience_fails(monkeypatch) -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    missing = botocore.ClientError({"Error": {"Code": "NoSuchKey"},
                                    "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")
    throttled = botocore.ClientError({"Error": {"Code": "SlowDown"},
                                      "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    assert not unreachable(_driver_error(missing)) and not unreachable(_driver_error(ValueError("x")))
    assert unreachable(_driver_error(throttled))
    assert unreachable(_driver_error(botocore.EndpointConnectionError(endpoint_url="http://s3")))

    async def fails(err: BaseException) -> str:
        raise err

    started = time.monotonic()
    with pytest.raises(RuntimeError):
        await patiently(lambda: fails(_driver_error(missing)))
    assert time.monotonic() - started < 0.2
    monkeypatch.setenv("ROLLOUTS_STORAGE_PATIENCE", "1")
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        await patiently(lambda: fails(_driver_error(ConnectionRefusedError())))
    assert 0.4 < time.monotonic() - started < 3.0
