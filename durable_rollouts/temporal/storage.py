"""State outside Temporal history, on temporalio's own ``ExternalStorage``.

``ROLLOUTS_STORAGE`` (or ``--storage``) names one store, shared by the client and every worker:

- ``file://PATH`` (default ``$ROLLOUTS_HOME/storage``): :class:`FileStorageDriver`, for one
  machine (or hosts sharing that directory);
- ``s3://BUCKET/PREFIX``: temporalio's ``S3StorageDriver`` over aioboto3; credentials, region and
  endpoint come from the standard ``AWS_*`` variables (``AWS_ENDPOINT_URL`` for any
  S3-compatible store);
- ``gs://BUCKET/PREFIX``: temporalio's ``GCSStorageDriver`` (needs ``gcloud-aio-storage``).

Two ways in: :func:`external_storage` plugs the driver into the data converter, so any payload
over ``ROLLOUTS_STORAGE_THRESHOLD`` bytes (default 256 KiB, after encryption) is stored by the
driver and history keeps a reference; :class:`Blobs` stores claim-checked blobs (traces, result
chunks, row files) through the same driver and names each one by a ``rollouts-storage:`` URI.
Both encrypt with the payload codec first when ``ROLLOUTS_PAYLOAD_KEY`` is set, so the store only
ever holds ciphertext. Store I/O runs on one background event loop per process, so the aioboto3
client is shared by every caller (sync or async, any loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlparse

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ExternalStorage,
    PayloadCodec,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from durable_rollouts.errors import ConfigError
from durable_rollouts.paths import atomic_write, rollouts_home
from durable_rollouts.settings import settings, var
from durable_rollouts.stores.blobs import register_blobs
from durable_rollouts.temporal.encryption import AESGCMCodec
from durable_rollouts.temporal.storage_loop import LOOP

__all__ = [
    "BLOB_SCHEME",
    "STORAGE_ENV",
    "Blobs",
    "FileStorageDriver",
    "StorageURL",
    "build_driver",
    "external_storage",
    "parse_storage_url",
    "patiently",
    "probe",
    "storage_url",
    "unreachable",
]

STORAGE_ENV = var("storage")
BLOB_SCHEME = "rollouts-storage:"
_T = TypeVar("_T")
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class StorageURL:
    """A parsed ``ROLLOUTS_STORAGE`` value."""

    scheme: str  # file | s3 | gs
    bucket: str = ""
    prefix: str = ""  # "" or "some/prefix/" (always ending in "/")
    path: str = ""  # file:// only

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


def storage_url() -> str:
    """``$ROLLOUTS_STORAGE``, else ``file://$ROLLOUTS_HOME/storage``."""
    return (settings().storage or "").strip() or f"file://{rollouts_home() / 'storage'}"


def parse_storage_url(value: str) -> StorageURL:
    """Parse ``file://PATH``, ``s3://BUCKET[/PREFIX]`` or ``gs://BUCKET[/PREFIX]``."""
    parsed = urlparse(value)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        path = unquote(parsed.netloc + parsed.path)
        if not path.startswith("/"):
            raise ConfigError(f"{STORAGE_ENV}={value!r}: a file:// store needs an absolute path")
        return StorageURL("file", path=path)
    if scheme in ("s3", "gs"):
        if not parsed.netloc:
            raise ConfigError(f"{STORAGE_ENV}={value!r}: no bucket (use {scheme}://BUCKET/PREFIX)")
        prefix = parsed.path.strip("/")
        return StorageURL(scheme, bucket=parsed.netloc, prefix=f"{prefix}/" if prefix else "")
    raise ConfigError(f"{STORAGE_ENV}={value!r}: use file://PATH, s3://BUCKET/PREFIX or "
                      "gs://BUCKET/PREFIX")






# ---------------------------------------------------------------------------------------------
# drivers


class FileStorageDriver(StorageDriver):
    """Payloads as files under ``root``, named by the SHA-256 of their bytes (one machine).

    Writes are atomic (temporary file + rename) and idempotent (same bytes, same file); reads
    check the hash, so a truncated or altered file is an error, never a wrong payload.
    """

    def __init__(self, root: Path | str, driver_name: str = "rollouts.file") -> None:
        self.root = Path(root)
        self._name = driver_name

    def name(self) -> str:
        return self._name

    def type(self) -> str:
        return "rollouts.file"

    def _path(self, digest: str) -> Path:
        return self.root / "sha256" / digest[:2] / digest

    def _put(self, payload: Payload) -> StorageDriverClaim:
        data = payload.SerializeToString()
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        return StorageDriverClaim(claim_data={"hash_algorithm": "sha256", "hash_value": digest})

    def _get(self, claim: StorageDriverClaim) -> Payload:
        digest = claim.claim_data.get("hash_value", "")
        if claim.claim_data.get("hash_algorithm") != "sha256" or len(digest) != 64:
            raise ValueError(f"FileStorageDriver: bad claim {dict(claim.claim_data)}")
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise RuntimeError(f"FileStorageDriver: cannot read {path} (stored on another host? "
                               f"use s3:// for workers on several machines): {err}") from err
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"FileStorageDriver integrity check failed for {path}")
        payload = Payload()
        payload.ParseFromString(data)
        return payload

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        return await asyncio.to_thread(lambda: [self._put(p) for p in payloads])

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        return await asyncio.to_thread(lambda: [self._get(c) for c in claims])


def build_driver(url: StorageURL) -> StorageDriver:
    """The driver for ``url`` (the S3/GCS clients connect lazily, on first use)."""
    if url.scheme == "file":
        return FileStorageDriver(url.path)
    if url.scheme == "s3":
        from temporalio.contrib.aws.s3driver import S3StorageDriver

        from durable_rollouts.temporal.storage_clients import S3Client

        return S3StorageDriver(S3Client(url.prefix), bucket=url.bucket)
    from temporalio.contrib.gcp.gcsdriver import GCSStorageDriver

    from durable_rollouts.temporal.storage_clients import GCSClient

    return GCSStorageDriver(GCSClient(url.prefix), bucket=url.bucket)


_DRIVERS: dict[str, StorageDriver] = {}


def _driver(value: str | None = None) -> tuple[StorageURL, StorageDriver]:
    url = parse_storage_url(value or storage_url())
    key = str(url)
    if key not in _DRIVERS:  # one per process and URL: its client (and connection pool) is shared
        _DRIVERS[key] = build_driver(url)
    return url, _DRIVERS[key]


def external_storage(value: str | None = None) -> ExternalStorage:
    """The ``ExternalStorage`` of the data converter: one driver, payloads over the threshold."""
    _, driver = _driver(value)
    return ExternalStorage(drivers=[driver], payload_size_threshold=settings().storage_threshold)


# ---------------------------------------------------------------------------------------------
# claim-checked blobs (traces, result chunks, row files)


_BLOB_ENCODING = b"binary/rollouts-blob"


class Blobs:
    """Bytes stored through the configured driver, named by ``rollouts-storage:`` URIs.

    Args:
        driver: the store (default: the ``ROLLOUTS_STORAGE`` one).
        codec: encrypts before storing (default: the ``ROLLOUTS_PAYLOAD_KEY`` codec, if set).
    """

    def __init__(self, driver: StorageDriver | None = None, codec: PayloadCodec | None = None,
                 *, use_env_codec: bool = True) -> None:
        if driver is None:
            _, driver = _driver()
        if codec is None and use_env_codec:
            codec = AESGCMCodec.from_env()
        self.driver, self.codec = driver, codec
        # The file driver's I/O runs in a worker thread from whichever loop awaits it, so async
        # callers skip the storage loop (one thread hop instead of two per blob). The S3/GCS
        # clients are bound to the storage loop and always go through it.
        self._loop_free = isinstance(driver, FileStorageDriver)

    async def _aput(self, data: bytes) -> str:
        payload = Payload(metadata={"encoding": _BLOB_ENCODING}, data=data)
        if self.codec is not None:
            (payload,) = await self.codec.encode([payload])
        (claim,) = await self.driver.store(StorageDriverStoreContext(), [payload])
        return BLOB_SCHEME + self.driver.name() + "?" + urlencode(sorted(claim.claim_data.items()))

    async def _aget(self, uri: str) -> bytes:
        name, claim = parse_blob_uri(uri)
        if name != self.driver.name():
            raise ValueError(f"{uri[:80]}... was stored by driver {name!r}, but {STORAGE_ENV} "
                             f"gives {self.driver.name()!r}")
        (payload,) = await self.driver.retrieve(StorageDriverRetrieveContext(), [claim])
        if self.codec is not None:
            (payload,) = await self.codec.decode([payload])
        elif payload.metadata.get("encoding") != _BLOB_ENCODING:
            raise ValueError(f"blob {uri[:80]}... is encrypted: set ROLLOUTS_PAYLOAD_KEY")
        return payload.data

    async def aput(self, data: bytes) -> str:
        """Store ``data``; returns its URI."""
        if self._loop_free:
            return await self._aput(data)
        return await LOOP.arun(patiently(lambda: self._aput(data)))

    async def aget(self, uri: str) -> bytes:
        """The bytes behind ``uri``."""
        if self._loop_free:
            return await self._aget(uri)
        return await LOOP.arun(patiently(lambda: self._aget(uri)))

    def put(self, data: bytes) -> str:
        """``aput`` for sync callers (safe inside a running loop: runs on the storage thread)."""
        if self._loop_free:
            return LOOP.run(self._aput(data))
        return LOOP.run(patiently(lambda: self._aput(data)))

    def get(self, uri: str) -> bytes:
        """``aget`` for sync callers."""
        if self._loop_free:
            return LOOP.run(self._aget(uri))
        return LOOP.run(patiently(lambda: self._aget(uri)))


# Errors (by class name, anywhere in a class's MRO) that mean the store could not be reached,
# from the standard library, botocore / aiobotocore and aiohttp (the GCS client).
_UNREACHABLE = frozenset({"ConnectionError", "TimeoutError", "HTTPClientError",
                          "ClientConnectionError", "ServerDisconnectedError", "ClientOSError"})


def unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the store could not be reached or
    answered 5xx/throttled, as opposed to a refusal (not found, access denied) or bad data."""
    seen: BaseException | None = err
    for _ in range(10):
        if seen is None:
            return False
        if _UNREACHABLE & {c.__name__ for c in type(seen).__mro__}:
            return True
        response = getattr(seen, "response", None)  # botocore's ClientError
        meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
        status = meta.get("HTTPStatusCode") or getattr(seen, "status", 0)  # aiohttp's errors
        if isinstance(status, int) and status >= 500:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def patiently(call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()``, again with backoff (0.5 s doubling to 5 s) while a remote store fails, for up
    to ``ROLLOUTS_STORAGE_PATIENCE`` seconds: an outage of the bucket shorter than that costs the
    step that reads or writes no attempt (and an agent step no re-run). A local disk's errors
    (full, read-only) are not waited out: ``Blobs`` calls its driver directly."""
    deadline = time.monotonic() + settings().storage_patience
    delay = 0.5
    while True:
        try:
            return await call()
        except (RuntimeError, OSError) as err:  # the S3/GCS drivers' "store/retrieve failed"
            if not unreachable(err) or time.monotonic() + delay > deadline:
                raise
            logger.warning("store unreachable (%s); retrying in %.1f s", str(err)[:200], delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def parse_blob_uri(uri: str) -> tuple[str, StorageDriverClaim]:
    """(driver name, claim) of a ``rollouts-storage:`` URI."""
    if not uri.startswith(BLOB_SCHEME):
        raise ValueError(f"not a {BLOB_SCHEME} uri: {uri[:80]!r}")
    name, _, query = uri[len(BLOB_SCHEME):].partition("?")
    return name, StorageDriverClaim(claim_data=dict(parse_qsl(query, keep_blank_values=True)))


def blobs() -> Blobs:
    """The process's Blobs for the current ``ROLLOUTS_STORAGE`` and payload key."""
    return Blobs()


# ---------------------------------------------------------------------------------------------
# start-up check


_PROBED: set[str] = set()


async def probe(value: str | None = None, timeout: float = 30.0) -> None:
    """Store and read back a tiny object: ``ConfigError`` (one line) when the store is unusable."""
    url, driver = _driver(value)
    if str(url) in _PROBED:
        return
    marker = Payload(metadata={"encoding": b"binary/plain"}, data=b"durable-rollouts storage probe")

    async def roundtrip() -> Payload:
        claims = await driver.store(StorageDriverStoreContext(), [marker])
        return (await driver.retrieve(StorageDriverRetrieveContext(), claims))[0]

    try:
        back = await asyncio.wait_for(LOOP.arun(roundtrip()), timeout)
    except TimeoutError:
        raise ConfigError(f"storage {url} did not answer within {timeout:.0f}s") from None
    except Exception as err:  # noqa: BLE001 - every cause becomes one line
        raise ConfigError(f"storage {url} is not usable: {_cause(err)}") from err
    if back.data != marker.data:
        raise ConfigError(f"storage {url} returned different bytes than were stored")
    _PROBED.add(str(url))


def _cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}"[:300]


register_blobs(blobs)  # claim checks (stores/) go to this store whenever the Temporal layer is loaded
