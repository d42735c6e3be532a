"""The data converter every client and worker uses: pydantic, plus payload encryption and storage.

``data_converter()`` is temporalio's pydantic converter with :class:`AESGCMCodec` when
``ROLLOUTS_PAYLOAD_KEY`` is set (``temporal.encryption``) and the ``ROLLOUTS_STORAGE`` external
storage (``temporal.storage``). The encryption names are re-exported here, their historic home.
Imports temporalio and the two modules above.
"""

from __future__ import annotations

import dataclasses

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from durable_rollouts.errors import ConfigError
from durable_rollouts.temporal.encryption import (
    ENCRYPTED_ENCODING,
    KEY_ENV_VAR,
    AESGCMCodec,
    PayloadDecryptionError,
    key_id,
    parse_keys,
)
from durable_rollouts.temporal.storage import external_storage

__all__ = [
    "ENCRYPTED_ENCODING",
    "KEY_ENV_VAR",
    "AESGCMCodec",
    "PayloadDecryptionError",
    "data_converter",
    "key_id",
    "parse_keys",
]


def data_converter(encrypt: bool | None = None, *, storage: bool = True) -> DataConverter:
    """The pydantic data converter, with :class:`AESGCMCodec` when payloads should be encrypted
    and ``ROLLOUTS_STORAGE``'s external storage (``durable_rollouts.temporal.storage``).

    temporalio encodes with the codec first and offloads after, so with a key set the store
    holds only ciphertext (and the size threshold applies to the encrypted payload).

    Args:
        encrypt: None (default) encrypts exactly when ``ROLLOUTS_PAYLOAD_KEY`` is set; True
            requires the key (``ConfigError`` without it); False never encrypts.
        storage: False leaves every payload inline (no external storage).
    """
    converter = pydantic_data_converter
    if storage:
        converter = dataclasses.replace(converter, external_storage=external_storage())
    if encrypt is False:
        return converter
    codec = AESGCMCodec.from_env()
    if codec is None:
        if encrypt:
            raise ConfigError(f"payload encryption requested but {KEY_ENV_VAR} is not set")
        return converter
    return dataclasses.replace(converter, payload_codec=codec)
