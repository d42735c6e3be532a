"""``OpenAIChatAgent``: a tool-calling agent loop against any OpenAI-compatible chat endpoint.

The agent talks to ``{base_url}/chat/completions`` over httpx. Its tools come from the
environment's capabilities: a ``shell`` tool when the env publishes an ``ssh`` capability, and
every tool of every ``mcp`` capability (their JSON schemas taken from the MCP tool list). Every
model turn and every tool result is recorded as a trace :class:`~durable_rollouts.models.Step`
(messages, tool calls, results, token usage; logprobs / token ids in ``step.extra`` when
``request_logprobs`` is set). The loop stops on a final answer (a reply without tool calls, put in
``run.trace.content``), at ``max_steps`` (``stop_reason="max_steps"``) or after a malformed tool
call the model failed to repair once (``stop_reason="malformed_tool_call"``).

The API key is read on the worker from the environment variable named by ``api_key_env``: it is
never a field, so it never reaches configs, workflow inputs or traces. Imports models, errors,
agents and capabilities; never envserver or Temporal.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import Field

from ..errors import ConfigError
from ..models import Step
from .agents import Agent
from .capabilities import close_capability, open_capability, protocol_family
from .retry import retry

if TYPE_CHECKING:
    from .run import Run

__all__ = ["OpenAIChatAgent"]

log = logging.getLogger(__name__)

_SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a bash command in the task's workspace; returns exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command"}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class _StatusError(RuntimeError):
    """The model server answered an HTTP error status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"chat completions answered {status}: {text[:500]}")
        self.status = status


def _transient(exc: Exception) -> bool:
    return isinstance(exc, httpx.TransportError) or (
        isinstance(exc, _StatusError) and exc.status in _RETRY_STATUS)


class MalformedToolCall(Exception):
    """A tool call the agent cannot execute (bad JSON, unknown tool, non-object arguments)."""


@dataclass
class _Toolbox:
    """The tools offered to the model and the open capability handles behind them."""

    specs: list[dict[str, Any]] = field(default_factory=list)
    # exposed tool name -> (kind "ssh"/"mcp", open handle, the tool's own name)
    routes: dict[str, tuple[str, Any, str]] = field(default_factory=dict)
    handles: list[Any] = field(default_factory=list)

    async def close(self) -> None:
        for handle in reversed(self.handles):
            await close_capability(handle)


class OpenAIChatAgent(Agent):
    """A tool-calling agent over an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Example::

        agent = OpenAIChatAgent(model="gpt-4o-mini", base_url="http://127.0.0.1:8000/v1")
        job = await taskset.run(agent, runtime=LocalRuntime("env.py"))
    """

    model: str
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = "OPENAI_API_KEY"
    max_steps: int = Field(default=20, ge=1)
    temperature: float | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    system_prompt: str | None = None
    request_logprobs: bool = False
    request_timeout_s: float = Field(default=120.0, gt=0)
    max_output_chars: int = Field(default=8000, gt=0)
    extra_body: dict[str, Any] = Field(default_factory=dict)

    async def __call__(self, run: Run) -> None:
        if run.client is None:
            raise ConfigError("OpenAIChatAgent needs a connected run (run.client is None)")
        toolbox = await self._open_tools(run)
        headers = {"Content-Type": "application/json"}
        api_key = os.environ.get(self.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
            run.trace.record(Step(source="system", messages=[messages[0]], ended_at=time.time()))
        messages.append({"role": "user", "content": run.prompt_text})
        run.trace.extra["tools"] = toolbox.specs  # what the model was offered, for training data
        try:
            async with httpx.AsyncClient(base_url=self.base_url.rstrip("/") + "/", headers=headers,
                                         timeout=self.request_timeout_s) as http:
                await self._loop(run, http, toolbox, messages)
        finally:
            await toolbox.close()

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self, run: Run, http: httpx.AsyncClient, toolbox: _Toolbox,
                    messages: list[dict[str, Any]]) -> None:
        trace = run.trace
        malformed = 0
        for _ in range(self.max_steps):
            started = time.time()
            reply = await self._complete(http, messages, toolbox.specs)
            choice = (reply.get("choices") or [{}])[0]
            message = dict(choice.get("message") or {})
            message.setdefault("role", "assistant")
            assistant = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
            messages.append(assistant)
            extra: dict[str, Any] = {"usage": reply.get("usage"), "model": reply.get("model"),
                                     "finish_reason": choice.get("finish_reason")}
            if self.request_logprobs:
                extra["logprobs"] = choice.get("logprobs")
                for key in ("token_ids", "prompt_token_ids"):
                    if key in choice or key in reply:
                        extra[key] = choice.get(key, reply.get(key))
            trace.record(Step(source="agent", messages=[assistant], started_at=started,
                              ended_at=time.time(), extra=extra))
            calls = message.get("tool_calls") or []
            if not calls:
                trace.content = _text(message.get("content"))
                trace.stop_reason = "length" if choice.get("finish_reason") == "length" else "done"
                return
            problems = await self._run_calls(trace, toolbox, calls, messages)
            if problems:
                malformed += 1
                if malformed >= 2:
                    trace.stop_reason = "malformed_tool_call"
                    trace.content = _text(message.get("content")) or None
                    return
                messages.append({"role": "user", "content": (
                    "Your previous tool call was malformed (" + "; ".join(problems) + "). "
                    "Call a listed tool with a JSON object of arguments matching its schema.")})
            else:
                malformed = 0
        trace.stop_reason = "max_steps"

    async def _run_calls(self, trace: Any, toolbox: _Toolbox, calls: list[dict[str, Any]],
                         messages: list[dict[str, Any]]) -> list[str]:
        problems: list[str] = []
        for call in calls:
            call_id = str(call.get("id") or f"call_{len(messages)}")
            function = call.get("function") or {}
            name = str(function.get("name") or "")
            started = time.time()
            arguments: dict[str, Any] = {}
            error: str | None = None
            try:
                arguments = _parse_arguments(name, function.get("arguments"), toolbox)
                result = await self._call_tool(toolbox, name, arguments)
            except MalformedToolCall as exc:
                problems.append(str(exc))
                error = f"malformed tool call: {exc}"
                result = error
            except Exception as exc:  # a tool failure is the model's problem to handle
                error = f"{type(exc).__name__}: {exc}"
                result = f"tool {name!r} failed: {error}"
            tool_message = {"role": "tool", "tool_call_id": call_id, "content": result}
            messages.append(tool_message)
            trace.record(Step(source="tool", messages=[tool_message], error=error,
                              started_at=started, ended_at=time.time(),
                              extra={"tool": name, "arguments": arguments}))
        return problems

    async def _complete(self, http: httpx.AsyncClient, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if tools:
            body["tools"] = tools
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.request_logprobs:
            body.setdefault("logprobs", True)
            body.setdefault("return_token_ids", True)  # vLLM / SGLang; ignored elsewhere

        async def post() -> dict[str, Any]:
            response = await http.post("chat/completions", json=body)
            if response.status_code >= 400:
                raise _StatusError(response.status_code, response.text)
            return dict(response.json())

        return await retry(post, attempts=4, first_delay_s=1.0, transient=_transient)

    # -- tools ---------------------------------------------------------------------------------

    async def _open_tools(self, run: Run) -> _Toolbox:
        assert run.client is not None
        box = _Toolbox()
        try:
            for binding in run.client.bindings:
                family = protocol_family(binding)
                if family == "ssh" and "shell" not in box.routes:
                    conn = await open_capability(run.client, binding["name"])
                    box.handles.append(conn)
                    box.specs.append(_SHELL_TOOL)
                    box.routes["shell"] = ("ssh", conn, "shell")
                elif family == "mcp":
                    mcp = await open_capability(run.client, binding["name"])
                    box.handles.append(mcp)
                    for tool in await mcp.list_tools():
                        exposed = tool.name
                        if exposed in box.routes:  # two servers with one tool name: qualify it
                            exposed = f"{binding['name']}__{tool.name}"
                        box.routes[exposed] = ("mcp", mcp, tool.name)
                        box.specs.append({"type": "function", "function": {
                            "name": exposed, "description": tool.description or "",
                            "parameters": dict(tool.input_schema or {"type": "object"}),
                        }})
        except BaseException:
            await box.close()
            raise
        return box

    async def _call_tool(self, toolbox: _Toolbox, name: str, arguments: dict[str, Any]) -> str:
        kind, handle, real = toolbox.routes[name]
        if kind == "ssh":
            import asyncssh  # already loaded: open_capability made this connection

            # stdin is /dev/null: a command that reads input must not wait for the ssh timeout.
            result = await handle.run(arguments["command"], check=False, stdin=asyncssh.DEVNULL)
            status = result.exit_status if result.exit_status is not None else result.exit_signal
            out = _clip(str(result.stdout or ""), self.max_output_chars)
            err = _clip(str(result.stderr or ""), self.max_output_chars)
            return f"exit code: {status}\nstdout:\n{out}\nstderr:\n{err}"
        outcome = await handle.call_tool(real, arguments, raise_on_error=False)
        parts = [getattr(b, "text", None) or json.dumps(_dump(b)) for b in outcome.content]
        text = "\n".join(parts)
        return _clip(f"error: {text}" if outcome.is_error else text, self.max_output_chars)


def _parse_arguments(name: str, raw: Any, toolbox: _Toolbox) -> dict[str, Any]:
    if name not in toolbox.routes:
        known = ", ".join(toolbox.routes) or "none"
        raise MalformedToolCall(f"unknown tool {name!r}; available: {known}")
    if isinstance(raw, dict):
        arguments = raw
    else:
        try:
            arguments = json.loads(raw or "{}")
        except (TypeError, ValueError) as exc:
            raise MalformedToolCall(f"arguments of {name!r} are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"arguments of {name!r} must be a JSON object")
    is_shell = toolbox.routes[name][0] == "ssh"
    if is_shell and not isinstance(arguments.get("command"), str):
        raise MalformedToolCall("shell needs a string 'command'")
    return arguments


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def _dump(block: Any) -> Any:
    dump = getattr(block, "model_dump", None)
    return dump(mode="json") if dump is not None else str(block)
