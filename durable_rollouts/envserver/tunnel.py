"""Server side of ``tunnel.open``: turn a fresh connection into a byte pipe to a capability.

When the first frame of a connection is ``tunnel.open {capability}``, the server dials the
capability's host:port, replies once with ``{"capability": name}`` and from then on copies raw
bytes both ways, so a substrate needs only one published port. An unknown capability (or one that
cannot be dialled) gets one error frame and the connection closes.

Imports the shared protocol module and ``environment.py``; nothing from ``sdk``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..streams import pipe
from ..protocol import ErrorCode, LineProtocol, TunnelOpenParams, error_frame, result_frame, valid_request_id
from .environment import Environment

__all__ = ["capability_address", "pipe", "serve_tunnel"]

_DEFAULT_PORTS = {"ssh": 22, "http": 80, "ws": 80, "https": 443, "wss": 443, "rfb": 5900}


def capability_address(url: str) -> tuple[str, int]:
    """``(host, port)`` to dial for a capability url; raises ``ValueError`` when unknown."""
    parts = urlsplit(url)
    host = parts.hostname
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    if not host or not port:
        raise ValueError(f"cannot tell host and port of capability url {url!r}")
    return host, port


async def serve_tunnel(
    env: Environment,
    authorize: Callable[[str | None], bool],
    frame: dict[str, Any],
    proto: LineProtocol,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Handle a connection whose first frame is ``tunnel.open`` (see module docstring)."""
    request_id = frame.get("id")
    answer = "id" in frame  # JSON-RPC: a notification gets no reply, not even an error

    async def fail(code: int, message: str) -> None:
        if answer:
            proto.send(error_frame(request_id, code, message))
            writer.write(proto.data_to_send())
            with contextlib.suppress(OSError):
                await writer.drain()

    if not valid_request_id(request_id):
        request_id = None
        await fail(ErrorCode.INVALID_REQUEST, "a request id must be a string, a number or null")
        return

    params_in = frame.get("params") or {}
    try:
        params = TunnelOpenParams.model_validate(params_in)
    except ValidationError as exc:
        await fail(ErrorCode.INVALID_PARAMS, f"bad tunnel.open params: {exc.errors()[0]['msg']}")
        return
    if not authorize(params.token):  # the server compares tokens in constant time
        await fail(ErrorCode.UNAUTHORIZED, "unauthorized: missing or wrong token")
        return
    try:
        capability = env.capability(params.capability)
        host, port = capability_address(capability.url)
    except KeyError:
        await fail(ErrorCode.INVALID_PARAMS, f"unknown capability {params.capability!r}")
        return
    except ValueError as exc:
        await fail(ErrorCode.INVALID_PARAMS, str(exc))
        return
    try:
        upstream = await asyncio.open_connection(host, port)
    except OSError as exc:
        await fail(ErrorCode.INTERNAL_ERROR, f"capability {params.capability!r} unreachable: {exc}")
        return
    if answer:
        proto.send(result_frame(request_id, {"capability": capability.name}))
        writer.write(proto.data_to_send())
    leftover = proto.take_buffered()
    if leftover:
        upstream[1].write(leftover)
    await pipe((reader, writer), upstream)
