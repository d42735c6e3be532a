"""A scripted OpenAI-compatible chat server for the agent tests (the only stand-in: no model here).

It answers ``POST /v1/chat/completions`` on loopback from a script of replies (dicts, or callables
that inspect the request body) and records every request with its headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1") -> dict[str, Any]:
    """An assistant reply that calls one tool (``arguments`` may be a raw, even broken, string)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}]}


def final(text: str) -> dict[str, Any]:
    """An assistant reply with no tool calls (the final answer)."""
    return {"role": "assistant", "content": text}


class ScriptedLLM:
    """A loopback HTTP/1.1 server speaking just enough of the chat-completions API."""

    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []  # {"headers": {...}, "body": {...}}
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _reply(self, body: dict[str, Any]) -> dict[str, Any]:
        item = self.script.pop(0) if self.script else final("(script exhausted)")
        message = item(body) if callable(item) else item
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        reply: dict[str, Any] = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
                                 "model": body.get("model"), "choices": [choice],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "ok", "logprob": -0.1, "top_logprobs": []}]}
            choice["token_ids"] = [42, 7]
            reply["prompt_token_ids"] = [1, 2, 3]
        return reply

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw or b"{}")
                self.requests.append({"path": lines[0].split()[1], "headers": headers, "body": body})
                data = json.dumps(self._reply(body)).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
