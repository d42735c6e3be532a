"""Optional encryption of Temporal payloads at rest (AES-256-GCM): :class:`AESGCMCodec`.

Temporal stores every workflow and activity argument and result in its history. With
``ROLLOUTS_PAYLOAD_KEY`` set (base64 of 32 random bytes, e.g. ``openssl rand -base64 32``), the
:class:`AESGCMCodec` encrypts each payload before it leaves the process and decrypts it on the way
back, so the Temporal server, its database and the Web UI only ever see ciphertext. Each payload
gets a fresh random 96-bit nonce; the metadata holds ``encoding: binary/encrypted`` and the key id
(a hash of the key, never the key), which is also bound into the authentication tag. Several keys
may be listed, comma-separated: the first encrypts, all decrypt (key rotation). Payloads that were
never encrypted pass through unchanged.

Imports temporalio, cryptography and the shared errors module only (``codec`` builds the
data converter on it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from durable_rollouts.errors import ConfigError, DurableRolloutsError
from durable_rollouts.settings import settings, var

__all__ = [
    "ENCRYPTED_ENCODING",
    "KEY_ENV_VAR",
    "AESGCMCodec",
    "PayloadDecryptionError",
    "key_id",
]

KEY_ENV_VAR = var("payload_key")
ENCRYPTED_ENCODING = b"binary/encrypted"
_KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12


class PayloadDecryptionError(DurableRolloutsError):
    """A payload cannot be decrypted: unknown key id, wrong key or tampered bytes."""


def key_id(key: bytes) -> str:
    """A short public identifier of ``key`` (a domain-separated SHA-256 prefix)."""
    return "k-" + hashlib.sha256(b"durable-rollouts payload key id\0" + key).hexdigest()[:16]


def parse_keys(value: str) -> list[bytes]:
    """Decode ``ROLLOUTS_PAYLOAD_KEY``: comma-separated base64 keys of exactly 32 bytes each."""
    keys = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            key = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            message = f"{KEY_ENV_VAR} must be base64 (e.g. `openssl rand -base64 32`)"
            raise ConfigError(message) from None
        if len(key) != 32:
            raise ConfigError(f"{KEY_ENV_VAR} keys must be 32 bytes, got {len(key)}")
        keys.append(key)
    if not keys:
        raise ConfigError(f"{KEY_ENV_VAR} is set but holds no key")
    return keys


class AESGCMCodec(PayloadCodec):
    """Encrypt payloads with AES-256-GCM.

    Args:
        keys: 32-byte keys; the first encrypts, every one can decrypt.
    """

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or any(len(k) != 32 for k in keys):
            raise ConfigError("AESGCMCodec needs one or more 32-byte keys")
        self._ciphers = {key_id(k): AESGCM(bytes(k)) for k in keys}
        self.key_id = key_id(keys[0])

    @classmethod
    def from_env(cls) -> AESGCMCodec | None:
        """The codec for ``ROLLOUTS_PAYLOAD_KEY``, or None when it is unset or empty."""
        value = settings().payload_key
        return cls(parse_keys(value.get_secret_value())) if value is not None else None

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decrypt(p) for p in payloads]

    def _encrypt(self, payload: Payload) -> Payload:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        kid = self.key_id.encode()
        sealed = self._ciphers[self.key_id].encrypt(nonce, payload.SerializeToString(), kid)
        return Payload(metadata={"encoding": ENCRYPTED_ENCODING, _KEY_ID: kid}, data=nonce + sealed)

    def _decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCRYPTED_ENCODING:
            return payload  # written before encryption was turned on
        kid = payload.metadata.get(_KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise PayloadDecryptionError(
                f"payload was encrypted with key id {kid or '(none)'} but {KEY_ENV_VAR} only has "
                f"{', '.join(sorted(self._ciphers))}: add the old key after the current one"
            )
        data = payload.data
        try:
            plain = cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], kid.encode())
        except InvalidTag:
            message = f"payload failed authentication under key id {kid}: tampered or corrupt"
            raise PayloadDecryptionError(message) from None
        inner = Payload()
        inner.ParseFromString(plain)
        return inner
