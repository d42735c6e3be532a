"""Substrate tokens, derived from the substrate key so that no token is stored in workflow history.

``substrate_token(key)`` is HMAC-SHA256 of the key under a worker secret, urlsafe base64. The
secret is ``$ROLLOUTS_TOKEN_SECRET`` when set (workers on several hosts that share substrates must
set the same value), else ``$ROLLOUTS_HOME/token.secret``: 32 random bytes created once per home
(mode 0600; concurrent creators end with one secret). A provider that protects its server with a
derived token marks the endpoint with ``params["token_from"] = "key"``; every later step derives
the token again with :func:`endpoint_token`. Imports models, errors and paths only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UnauthorizedError
from ..models import Endpoint
from ..paths import rollouts_home
from ..settings import settings, var

__all__ = [
    "SECRET_ENV_VAR",
    "derived_params",
    "endpoint_token",
    "secret_path",
    "substrate_token",
    "token_rejected",
    "uses_derived_token",
]

SECRET_ENV_VAR = var("token_secret")
SECRET_BYTES = 32
TOKEN_FROM = "token_from"


def secret_path() -> Path:
    """The per-home secret file (``$ROLLOUTS_HOME/token.secret``)."""
    return rollouts_home() / "token.secret"


def substrate_token(key: str) -> str:
    """The token of the substrate placed under ``key`` (equal on workers sharing the secret)."""
    digest = hmac.new(_secret(), key.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def derived_params(**extra: Any) -> dict[str, Any]:
    """``Endpoint.params`` of a substrate whose token is derived from its key (plus ``extra``)."""
    return {TOKEN_FROM: "key", **extra}


def uses_derived_token(endpoint: Endpoint) -> bool:
    """Whether ``endpoint``'s token is derived from its key (rather than given, or absent)."""
    return "token" not in endpoint.params and endpoint.params.get(TOKEN_FROM) == "key"


def endpoint_token(endpoint: Endpoint) -> str | None:
    """The token to show ``endpoint``: an explicit ``params["token"]`` (a borrowed Runtime, or an
    endpoint recorded before tokens were derived), else the key's derived token, else None."""
    if "token" in endpoint.params:
        return endpoint.params["token"]
    return substrate_token(endpoint.key) if uses_derived_token(endpoint) else None


def token_rejected(exc: UnauthorizedError, url: str) -> UnauthorizedError:
    """``exc`` restated for a rejected derived token, saying what to fix (one line)."""
    return UnauthorizedError(
        exc.code,
        f"{exc.message}; the env at {url} refused this worker's derived substrate token: "
        f"workers on different hosts that share substrates need the same {SECRET_ENV_VAR}",
    )


def _secret() -> bytes:
    raw = settings().token_secret
    if raw is not None:
        return raw.get_secret_value().encode()
    return _file_secret(secret_path())


def _file_secret(path: Path) -> bytes:
    """The secret in ``path``, created first when missing (the first creator wins any race)."""
    if not path.exists():
        try:
            _create(path)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the token secret {path} ({exc}); set {SECRET_ENV_VAR}"
            ) from exc
    return _read_secret(path)


def _create(path: Path) -> None:
    """Write 32 random bytes to a private temp file, then link it into place (never replacing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)  # exact, whatever the umask
            fh.write(secrets.token_bytes(SECRET_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic and never replaces: a concurrent creator's file stays
        except FileExistsError:
            pass
        except OSError:  # no hard links here: the first O_EXCL creator writes in place
            _create_in_place(path, tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)


def _create_in_place(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _read_secret(path: Path) -> bytes:
    for _ in range(100):  # an in-place creator (no hard links) may still be writing
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the token secret {path}: {exc}") from exc
        if len(data) >= SECRET_BYTES:
            return data
        time.sleep(0.01)
    raise ConfigError(
        f"the token secret {path} holds fewer than {SECRET_BYTES} bytes: delete it (a new one is "
        f"created) or set {SECRET_ENV_VAR}"
    )
