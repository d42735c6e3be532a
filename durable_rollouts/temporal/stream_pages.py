"""A stream's pages, manifest and closed-job cursors in ``ROLLOUTS_STORAGE``, under named keys.

The blobs of ``storage.Blobs`` are named by their content; a stream page must be found by its
job, batch and number (``workflows.stream_paging`` names the keys), and a consumer's cursor after
the job closed changes in place. So these are named objects in the same store: files under
``<root>/named/`` for ``file://``, objects under the prefix for ``s3://`` and ``gs://`` (through
the drivers' own clients). Encrypted with the payload codec when ``ROLLOUTS_PAYLOAD_KEY`` is set,
like every blob. Writing a page again writes the same groups (the activity is idempotent); a
cursor only moves forward.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from durable_rollouts.paths import atomic_write
from durable_rollouts.temporal import storage
from durable_rollouts.temporal.encryption import AESGCMCodec
from durable_rollouts.workflows.stream import FinishedGroup, check_consumer
from durable_rollouts.workflows.stream_paging import (
    StreamManifest,
    cursor_key,
    manifest_key,
    page_key,
)

__all__ = ["NamedObjects", "StreamStore"]

_ENCODING = b"binary/rollouts-named"


class NamedObjects:
    """Bytes under a key in the ``ROLLOUTS_STORAGE`` store (``aget`` of a missing key: None)."""

    def __init__(self, value: str | None = None, codec: PayloadCodec | None = None) -> None:
        self.url, self.driver = storage._driver(value)
        self.codec = codec if codec is not None else AESGCMCodec.from_env()

    async def _encode(self, data: bytes) -> bytes:
        payload = Payload(metadata={"encoding": _ENCODING}, data=data)
        if self.codec is not None:
            (payload,) = await self.codec.encode([payload])
        return payload.SerializeToString()

    async def _decode(self, raw: bytes, key: str) -> bytes:
        payload = Payload()
        payload.ParseFromString(raw)
        if self.codec is not None:
            (payload,) = await self.codec.decode([payload])
        elif payload.metadata.get("encoding") != _ENCODING:
            raise ValueError(f"{key} in {self.url} is encrypted: set ROLLOUTS_PAYLOAD_KEY")
        return payload.data

    def _file(self, key: str) -> Path:
        return Path(self.url.path) / "named" / key

    async def aput(self, key: str, data: bytes) -> None:
        raw = await self._encode(data)
        if self.url.scheme == "file":
            path = self._file(key)

            def write() -> None:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, raw)

            await asyncio.to_thread(write)
            return
        client, bucket = self._remote()
        if self.url.scheme == "s3":
            await client.put_object(bucket=bucket, key=key, data=raw)
        else:
            await client.put_object(bucket=bucket, object_name=key, data=raw)

    async def aget(self, key: str) -> bytes | None:
        if self.url.scheme == "file":
            path = self._file(key)
            try:
                raw = await asyncio.to_thread(path.read_bytes)
            except FileNotFoundError:
                return None
        else:
            client, bucket = self._remote()
            name = {"key": key} if self.url.scheme == "s3" else {"object_name": key}
            if not await client.object_exists(bucket=bucket, **name):
                return None
            raw = await client.get_object(bucket=bucket, **name)
        return await self._decode(raw, key)

    def _remote(self) -> tuple[Any, str]:
        return self.driver._client, self.driver._bucket  # type: ignore[attr-defined]


class StreamStore:
    """One batch's stream in storage: its pages, its manifest, and cursors after it closed."""

    def __init__(self, job_id: str, batch_index: int = 0, objects: NamedObjects | None = None) -> None:
        self.job_id, self.batch_index = job_id, batch_index
        self.objects = objects or NamedObjects()
        self._page: tuple[int, list[FinishedGroup]] | None = None  # the last page read

    async def put_page(self, page: int, groups: list[FinishedGroup]) -> None:
        data = "".join(g.model_dump_json() + "\n" for g in groups).encode()
        await self.objects.aput(page_key(self.job_id, self.batch_index, page), data)

    async def page(self, page: int) -> list[FinishedGroup]:
        """The groups of page ``page`` (the last one read is cached)."""
        if self._page is not None and self._page[0] == page:
            return self._page[1]
        key = page_key(self.job_id, self.batch_index, page)
        data = await self.objects.aget(key)
        if data is None:
            raise FileNotFoundError(f"stream page {key} is not in {self.objects.url}: was "
                                    f"{storage.STORAGE_ENV} changed since the job ran?")
        groups = [FinishedGroup.model_validate_json(line) for line in data.decode().splitlines() if line]
        self._page = (page, groups)
        return groups

    async def read(self, start: int, limit: int, page_size: int, end: int) -> list[FinishedGroup]:
        """Up to ``limit`` paged groups from ``start``, all before ``end``, in delivery order."""
        out: list[FinishedGroup] = []
        seq = start
        while seq < end and len(out) < limit:
            groups = await self.page(seq // page_size)
            offset = seq - (seq // page_size) * page_size
            chunk = groups[offset:offset + min(limit - len(out), end - seq)]
            if not chunk:
                break
            out.extend(chunk)
            seq += len(chunk)
        return out

    async def put_manifest(self, manifest: StreamManifest) -> None:
        await self.objects.aput(manifest_key(self.job_id, self.batch_index),
                                manifest.model_dump_json().encode())

    async def manifest(self) -> StreamManifest | None:
        data = await self.objects.aget(manifest_key(self.job_id, self.batch_index))
        return None if data is None else StreamManifest.model_validate_json(data)

    async def cursor(self, consumer: str) -> int:
        """``consumer``'s cursor as stored after the job closed (0: none stored)."""
        data = await self.objects.aget(cursor_key(self.job_id, self.batch_index, check_consumer(consumer)))
        return 0 if data is None else int(data)

    async def put_cursor(self, consumer: str, cursor: int) -> int:
        """Move ``consumer``'s stored cursor forward to ``cursor``; returns the stored one."""
        current = await self.cursor(consumer)
        if cursor > current:
            await self.objects.aput(cursor_key(self.job_id, self.batch_index, consumer),
                                    str(cursor).encode())
        return max(cursor, current)

