"""Object-store clients for temporalio's S3 and GCS storage drivers.

They implement temporalio's ``S3StorageDriverClient`` / ``GCSStorageDriverClient`` (the drivers
themselves are temporalio's), add the ``PREFIX`` of ``s3://BUCKET/PREFIX`` to every key, and run
every request on the storage module's background loop, so one connection pool serves all callers.
aioboto3 reads credentials, region and endpoint from the standard ``AWS_*`` variables
(``AWS_ENDPOINT_URL`` for an S3-compatible store); gcloud-aio-storage reads the usual Google ones.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
from collections.abc import Mapping
from typing import Any

from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.contrib.gcp.gcsdriver import GCSStorageDriverClient

from durable_rollouts.errors import ConfigError
from durable_rollouts.temporal.storage_loop import LOOP

__all__ = ["GCSClient", "S3Client"]


class S3Client(S3StorageDriverClient):
    """aioboto3 S3 client, opened on first use; keys are ``prefix + key``."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._client: Any = None
        self._lock: asyncio.Lock | None = None

    async def _s3(self) -> Any:
        if self._client is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self._client is None:
                    self._client = await self._open()
        return self._client

    async def _open(self) -> Any:
        try:
            import aioboto3
            from botocore.config import Config
        except ImportError as err:
            raise ConfigError("s3:// storage needs aioboto3: pip install 'durable-rollouts[s3]'") from err
        options: dict[str, Any] = {"connect_timeout": 10, "read_timeout": 120,
                                   "max_pool_connections": 64}  # one pool for the process
        if not (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
            options["retries"] = {"mode": "standard", "max_attempts": 3}
        manager = aioboto3.Session().client("s3", config=Config(**options))
        client = await manager.__aenter__()  # kept for the process's lifetime
        atexit.register(_close, manager)
        return client

    def describe(self) -> Mapping[str, str]:
        info = {"prefix": self.prefix} if self.prefix else {}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            info["endpoint"] = endpoint
        if self._client is not None and self._client.meta.region_name:
            info["client_region"] = self._client.meta.region_name
        return info

    async def object_exists(self, *, bucket: str, key: str) -> bool:

        return await LOOP.arun(self._exists(bucket, self.prefix + key))

    async def _exists(self, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            await (await self._s3()).head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:

        async def put() -> None:
            await (await self._s3()).put_object(Bucket=bucket, Key=self.prefix + key, Body=data)

        await LOOP.arun(put())

    async def get_object(self, *, bucket: str, key: str) -> bytes:

        async def get() -> bytes:
            response = await (await self._s3()).get_object(Bucket=bucket, Key=self.prefix + key)
            async with response["Body"] as body:
                return bytes(await body.read())

        return await LOOP.arun(get())


def _close(manager: Any) -> None:
    """At exit: close the aioboto3 client (its HTTP session) on the storage loop."""

    with contextlib.suppress(Exception):
        LOOP.run(asyncio.wait_for(manager.__aexit__(None, None, None), 2.0))


class GCSClient(GCSStorageDriverClient):
    """gcloud-aio-storage client, opened on first use; object names are ``prefix + name``.

    Not exercised against a live bucket in this repository's tests (only its construction).
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._inner: Any = None

    def _gcs(self) -> Any:
        if self._inner is None:
            try:
                from gcloud.aio.storage import Storage
                from temporalio.contrib.gcp.gcsdriver.gcloud_aio import new_gcloud_aio_client
            except ImportError as err:
                raise ConfigError("gs:// storage needs gcloud-aio-storage: "
                                  "pip install gcloud-aio-storage") from err
            self._inner = new_gcloud_aio_client(Storage())
        return self._inner

    async def object_exists(self, *, bucket: str, object_name: str) -> bool:

        return await LOOP.arun(self._gcs().object_exists(
            bucket=bucket, object_name=self.prefix + object_name))

    async def put_object(self, *, bucket: str, object_name: str, data: bytes) -> None:

        await LOOP.arun(self._gcs().put_object(
            bucket=bucket, object_name=self.prefix + object_name, data=data))

    async def get_object(self, *, bucket: str, object_name: str) -> bytes:

        return await LOOP.arun(self._gcs().get_object(
            bucket=bucket, object_name=self.prefix + object_name))
