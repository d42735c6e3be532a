"""Helpers of the durable-turn tests (importable by worker subprocesses: this dir is on their path).

- :class:`StepsModel`: a scripted OpenAI-compatible server for ``steps_env.py`` whose reply is a
  function of the conversation (the next ``echo step-K`` after K-1 tool results, then a final
  answer), so a resumed agent gets the same replies. It can hold request N (the test kills the
  worker while it waits) and answer request N with an error status (``fail``), and records
  every request with its arrival time. The only stand-in of these tests: there is no model here.
- :class:`TurnsAgent`: a custom agent that uses ``run.checkpoint`` / ``run.restored_state``
  directly; one "tool call" per turn is a line in ``log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from durable_rollouts.sdk.agents import Agent
from durable_rollouts.sdk.run import Run

HERE = Path(__file__).resolve().parent
STEPS_ENV = str(HERE / "steps_env.py")


def tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages", []) if m.get("role") == "tool")


class StepsModel:
    """``POST /v1/chat/completions`` on loopback; see the module docstring.

    Args:
        n: how many ``echo`` commands to ask for before answering ``done``.
        hold: 1-based request numbers to hold (never answered; the connection just hangs).
        fail: 1-based request number -> (status, headers) answered instead of a reply, once.
        command: the shell command for step K (``{k}`` is replaced).
        output_bytes: when > 0, each command also prints this many bytes (long conversations).
    """

    def __init__(self, n: int = 6, hold: set[int] | None = None,
                 fail: dict[int, tuple[int, dict[str, str]]] | None = None,
                 command: str = "echo step-{k} >> log.txt", output_bytes: int = 0) -> None:
        self.n, self.hold, self.fail = n, set(hold or ()), dict(fail or {})
        self.command, self.output_bytes = command, output_bytes
        self.requests: list[dict[str, Any]] = []
        self.held = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> StepsModel:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        done = tool_results(body)
        if done < self.n:
            k = done + 1
            command = self.command.format(k=k)
            if self.output_bytes:
                command += f"; head -c {self.output_bytes} /dev/zero | tr '\\0' a"
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{k}", "type": "function",
                "function": {"name": "shell", "arguments": json.dumps({"command": command})}}]}
        else:
            message = {"role": "assistant", "content": "done"}
        prompt_tokens = len(json.dumps(body.get("messages", []))) // 4
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
                "model": body.get("model"), "choices": [{
                    "index": 0, "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 20,
                          "total_tokens": prompt_tokens + 20}}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))) or b"{}")
                self.requests.append({"at": time.monotonic(), "body": body, "headers": headers})
                number = len(self.requests)
                if number in self.hold:
                    self.held.set()
                    await reader.read()  # held (never answered) until the client goes away
                    return
                status, extra = self.fail.pop(number, (200, {}))
                data = json.dumps(self.reply(body) if status == 200 else
                                  {"error": {"message": f"scripted {status}"}}).encode()
                head_out = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
                            "Content-Type: application/json", f"Content-Length: {len(data)}",
                            *(f"{k}: {v}" for k, v in extra.items())]
                writer.write(("\r\n".join(head_out) + "\r\n\r\n").encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def usage(self) -> list[int]:
        """The total tokens each request cost (as the replies reported them)."""
        return [self.reply(r["body"])["usage"]["total_tokens"] for r in self.requests]


class TurnsAgent(Agent):
    """``turns`` turns; each sleeps ``think_s`` (the "model"), appends ``<rollout> <turn> <pid>``
    to ``log`` (the "tool call"), checkpoints (unless ``checkpoint=False``) and then appends the
    turn to ``log + '.cp'`` (so a test knows the checkpoint returned). Answers ``answer``. A
    row whose args' tag is a key of ``turns_for`` takes that many turns instead. With ``tool``
    the line is written by the env, in its own process: the turn calls the ``turn`` tool of its
    ``turns`` MCP capability (``tests/temporal/turns_env.py``)."""

    turns: int = 5
    turns_for: dict[str, int] = {}
    think_s: float = 0.3
    log: str = ""
    answer: str = "x"
    checkpoint: bool = True
    state_bytes: int = 0  # pad the state (large-checkpoint test)
    tool: bool = False  # the side effect is the env's (an MCP tool call), not this process's

    async def __call__(self, run: Run) -> None:
        state = run.restored_state or {"turn": 0, "resumed": 0}
        if run.restored_state is not None:
            state["resumed"] += 1
        tag = run.task.args.get("tag") if run.task is not None else None
        turns = self.turns_for.get(tag, self.turns) if isinstance(tag, str) else self.turns
        while state["turn"] < turns:
            await asyncio.sleep(self.think_s)
            state["turn"] += 1
            if self.tool:
                tools = await run.open("turns")
                await tools.call_tool("turn", {"log": self.log, "rollout": run.rollout_id,
                                               "turn": state["turn"], "by": os.getpid()})
            else:
                _append(self.log, f"{run.rollout_id} {state['turn']} {os.getpid()}")
            if self.state_bytes:
                state["pad"] = "p" * self.state_bytes
            if self.checkpoint:
                await run.checkpoint(state)
                _append(self.log + ".cp", f"{run.rollout_id} {state['turn']} {os.getpid()}")
        run.trace.content = self.answer
        run.trace.extra["resumed"] = state["resumed"]


def _append(path: str, line: str) -> None:
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")
