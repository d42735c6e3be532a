"""Payload encryption at rest: AES-GCM codec round trip, tamper detection, wrong/unknown keys,
and the data converter that turns it on exactly when ROLLOUTS_PAYLOAD_KEY is set."""

from __future__ import annotations

import base64
import dataclasses
import os
from typing import Annotated, Any

import pytest
from pydantic_core import core_schema
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter

from durable_rollouts.temporal.codec import (
    ENCRYPTED_ENCODING,
    KEY_ENV_VAR,
    PYDANTIC_CONVERTER,
    AESGCMCodec,
    PayloadDecryptionError,
    SharedPydanticPayloadConverter,
    data_converter,
    key_id,
)
from durable_rollouts.errors import ConfigError
from durable_rollouts.models import Task

KEY_A, KEY_B = os.urandom(32), os.urandom(32)


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


async def test_values_round_trip_and_the_ciphertext_hides_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV_VAR, _b64(KEY_A))
    converter = data_converter()
    task = Task(env="e", id="t", args={"word": "plaintext-marker-123"})
    payloads = await converter.encode([task, "another-marker-456", {"n": 1}])
    for payload in payloads:
        assert payload.metadata["encoding"] == ENCRYPTED_ENCODING
        assert payload.metadata["encryption-key-id"] == key_id(KEY_A).encode()
        assert b"marker" not in payload.SerializeToString() and KEY_A not in payload.SerializeToString()
    assert await converter.decode(payloads, [Task, str, dict]) == [task, "another-marker-456", {"n": 1}]


async def test_every_payload_gets_a_fresh_nonce() -> None:
    codec = AESGCMCodec([KEY_A])
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"same"')
    first, second = await codec.encode([plain, plain])
    assert first.data[:12] != second.data[:12] and first.data != second.data


async def test_tampered_ciphertext_or_metadata_is_refused() -> None:
    codec = AESGCMCodec([KEY_A])
    (sealed,) = await codec.encode([Payload(metadata={"encoding": b"json/plain"}, data=b'"v"')])
    flipped = bytearray(sealed.data)
    flipped[-1] ^= 1
    with pytest.raises(PayloadDecryptionError, match="tampered"):
        await codec.decode([Payload(metadata=dict(sealed.metadata), data=bytes(flipped))])
    with pytest.raises(PayloadDecryptionError):
        await codec.decode([Payload(metadata=dict(sealed.metadata), data=sealed.data[:20])])


async def test_a_payload_sealed_with_another_key_is_refused_with_a_clear_error() -> None:
    (sealed,) = await AESGCMCodec([KEY_B]).encode([Payload(metadata={"encoding": b"json/plain"}, data=b"1")])
    with pytest.raises(PayloadDecryptionError, match=f"key id {key_id(KEY_B)}.*{KEY_ENV_VAR}"):
        await AESGCMCodec([KEY_A]).decode([sealed])
    # Same key id claimed, different key: authentication fails instead of yielding garbage.
    forged = Payload(metadata={"encoding": ENCRYPTED_ENCODING, "encryption-key-id": key_id(KEY_A).encode()}, data=sealed.data)
    with pytest.raises(PayloadDecryptionError, match="authentication"):
        await AESGCMCodec([KEY_A]).decode([forged])


async def test_rotation_decrypts_with_an_older_key_listed_second() -> None:
    (old,) = await AESGCMCodec([KEY_B]).encode([Payload(metadata={"encoding": b"json/plain"}, data=b"2")])
    rotated = AESGCMCodec([KEY_A, KEY_B])
    (plain,) = await rotated.decode([old])
    assert plain.data == b"2"
    (new,) = await rotated.encode([plain])
    assert new.metadata["encryption-key-id"] == key_id(KEY_A).encode()


async def test_unencrypted_payloads_pass_through_decode() -> None:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"old history"')
    assert await AESGCMCodec([KEY_A]).decode([plain]) == [plain]


def test_data_converter_encrypts_only_when_the_key_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    assert data_converter().payload_codec is None
    assert data_converter(storage=False) is PYDANTIC_CONVERTER
    with pytest.raises(ConfigError, match=KEY_ENV_VAR):
        data_converter(encrypt=True)
    monkeypatch.setenv(KEY_ENV_VAR, _b64(KEY_A))
    assert isinstance(data_converter().payload_codec, AESGCMCodec)
    assert data_converter(encrypt=False, storage=False) is PYDANTIC_CONVERTER
    assert data_converter(encrypt=False).payload_codec is None
    assert data_converter().payload_converter_class is SharedPydanticPayloadConverter


@pytest.mark.parametrize("value", ["not base64!!", _b64(bytes(range(16))), " , "])  # 16 bytes: short
def test_malformed_keys_are_config_errors(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(KEY_ENV_VAR, value)
    with pytest.raises(ConfigError, match=KEY_ENV_VAR):
        data_converter()


class _CountsSchemaBuilds:
    """A type annotation that counts how often pydantic builds a TypeAdapter's schema for it."""

    def __init__(self) -> None:
        self.builds = 0

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        self.builds += 1
        return handler(source)


async def _schema_builds(converter_class: type, copies: int = 3) -> int:
    """Decode one payload through a data converter and ``copies`` copies of it, as temporalio
    copies it (``dataclasses.replace``, which instantiates the payload converter class again) for
    every activation and activity it serializes for; how many TypeAdapter schemas were built."""
    counter = _CountsSchemaBuilds()
    hint = Annotated[int, counter]
    converter = dataclasses.replace(data_converter(), payload_converter_class=converter_class)
    payloads = await converter.encode([7])
    for copy in [converter, *(dataclasses.replace(converter) for _ in range(copies))]:
        assert await copy.decode(payloads, [hint]) == [7]
    return counter.builds


async def test_copies_of_the_data_converter_build_a_type_adapter_once() -> None:
    assert data_converter().payload_converter_class is SharedPydanticPayloadConverter
    assert await _schema_builds(SharedPydanticPayloadConverter) == 1


async def test_temporalios_own_class_builds_it_again_in_every_copy() -> None:
    """Why SharedPydanticPayloadConverter exists. If this fails, temporalio keeps its cache
    across copies now and the class can go."""
    assert await _schema_builds(PydanticPayloadConverter) == 4
