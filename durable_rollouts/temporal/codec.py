"""The data converter every client and worker uses: pydantic, plus payload encryption and storage.

``data_converter()`` is temporalio's pydantic converter with :class:`AESGCMCodec` when
``ROLLOUTS_PAYLOAD_KEY`` is set (``temporal.encryption``) and the ``ROLLOUTS_STORAGE`` external
storage (``temporal.storage``). The encryption names are re-exported here, their historic home.
Imports temporalio and the two modules above.

Its payload converter class is :class:`SharedPydanticPayloadConverter`: temporalio's pydantic
payload converter, built once. With external storage on, temporalio copies the data converter
for every activation and activity it serializes for (``DataConverter._with_store_context`` is a
``dataclasses.replace``, whose ``__post_init__`` instantiates ``payload_converter_class`` again),
and each new ``PydanticPayloadConverter`` built a pydantic ``SchemaSerializer`` and started with
an empty ``TypeAdapter`` cache, so every payload it decoded built its type adapter anew.
"""

from __future__ import annotations

import dataclasses
import functools

from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter

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
    "PYDANTIC_CONVERTER",
    "AESGCMCodec",
    "PayloadDecryptionError",
    "SharedPydanticPayloadConverter",
    "data_converter",
    "key_id",
    "parse_keys",
]


@functools.cache
def _pydantic_converters() -> tuple[EncodingPayloadConverter, ...]:
    """The encoding converters of one ``PydanticPayloadConverter`` (stateless but for caches)."""
    return tuple(PydanticPayloadConverter().converters.values())


class SharedPydanticPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` whose encoding converters (the JSON one holds the
    ``TypeAdapter`` cache) are built once per process and shared by every instance."""

    def __init__(self) -> None:
        CompositePayloadConverter.__init__(self, *_pydantic_converters())


# The converter without codec or storage; ``data_converter()`` adds those.
PYDANTIC_CONVERTER = DataConverter(payload_converter_class=SharedPydanticPayloadConverter)


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
    converter = PYDANTIC_CONVERTER
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
