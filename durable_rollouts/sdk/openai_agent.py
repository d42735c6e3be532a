"""``OpenAIChatAgent``: a tool-calling agent loop against any OpenAI-compatible chat endpoint.

The agent talks to ``{base_url}/chat/completions`` over httpx. Its tools come from the
environment's capabilities: a ``shell`` tool when the env publishes an ``ssh`` capability, and
every tool of every ``mcp`` capability (their JSON schemas taken from the MCP tool list). Every
model turn and every tool result is recorded as a trace :class:`~durable_rollouts.models.Step`
(messages, tool calls, results, token usage; logprobs / token ids in ``step.extra`` when
``request_logprobs`` is set). The loop stops on a final answer (a reply without tool calls, put in
``run.trace.content``), at ``max_steps`` (``stop_reason="max_steps"``) or after a malformed tool
call the model failed to repair once (``stop_reason="malformed_tool_call"``).

Durable turns (``checkpoints="step"``, the default): the agent calls ``run.checkpoint`` after
every model reply that calls tools and after every tool result, so a retried agent step (its
worker died, or the model API failed transiently) resumes from the conversation in the
checkpointed trace. It repeats at most the model request that was in flight, and never a tool
call whose result was checkpointed; a tool call that ran but was not yet checkpointed when the
worker died runs again (tool calls are at-least-once). ``"turn"`` checkpoints once per turn (after
its tool results: fewer history events, a crash may repeat one reply and its calls); ``"off"``
never checkpoints (a retried step starts over). Model API failures raise ``ModelAPIError``:
retryable for 408/409/429/5xx and transport errors/timeouts (the retry waits ``Retry-After``),
final for the rest (400/401/403/404) with the server's message.

The API key is read on the worker from the environment variable named by ``api_key_env``: it is
never a field, so it never reaches configs, workflow inputs or traces. Imports models, errors,
agents and capabilities; never envserver or Temporal.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import Field

from ..client.capabilities import close_capability, open_capability, protocol_family
from ..errors import ConfigError, ModelAPIError
from ..models import Step
from .agents import Agent

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
    checkpoints: Literal["step", "turn", "off"] = "step"

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
        messages.append({"role": "user", "content": run.prompt_text})
        state = run.restored_state
        if state is None:
            state = {"turn": 0, "malformed": 0, "calls": 0, "done": 0, "problems": []}
            if self.system_prompt:
                run.trace.record(Step(source="system", messages=[messages[0]],
                                      ended_at=time.time()))
        else:  # resumed: the conversation is the checkpointed trace
            messages.extend(_conversation(run.trace.steps))
        run.trace.extra["tools"] = toolbox.specs  # what the model was offered, for training data
        try:
            async with httpx.AsyncClient(base_url=self.base_url.rstrip("/") + "/", headers=headers,
                                         timeout=self.request_timeout_s) as http:
                await self._loop(run, http, toolbox, messages, dict(state))
        finally:
            await toolbox.close()

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self, run: Run, http: httpx.AsyncClient, toolbox: _Toolbox,
                    messages: list[dict[str, Any]], state: dict[str, Any]) -> None:
        """Turns until a final answer. ``state``: ``turn``, ``malformed`` (consecutive bad turns)
        and, mid-turn, ``calls`` (of the current reply), ``done`` and ``problems``."""
        trace = run.trace
        while state["turn"] < self.max_steps:
            if not state["calls"]:  # the model's move
                message, finish = await self._reply(trace, http, toolbox, messages)
                calls = message.get("tool_calls") or []
                if not calls:
                    trace.content = _text(message.get("content"))
                    trace.stop_reason = "length" if finish == "length" else "done"
                    return
                state.update(calls=len(calls), done=0, problems=[])
                await self._save(run, state, "step")  # the reply is durable: never requested again
            calls = next(m for m in reversed(messages) if m["role"] == "assistant")["tool_calls"]
            while state["done"] < state["calls"]:
                problem = await self._run_call(trace, toolbox, calls[state["done"]], messages)
                state["problems"] += [problem] if problem else []
                state["done"] += 1
                if state["done"] < state["calls"]:
                    await self._save(run, state, "step")
            problems, state["calls"], state["done"], state["problems"] = state["problems"], 0, 0, []
            if problems:
                state["malformed"] += 1
                if state["malformed"] >= 2:
                    last = next(m for m in reversed(messages) if m["role"] == "assistant")
                    trace.stop_reason = "malformed_tool_call"
                    trace.content = _text(last.get("content")) or None
                    return
                repair = {"role": "user", "content": (
                    "Your previous tool call was malformed (" + "; ".join(problems) + "). "
                    "Call a listed tool with a JSON object of arguments matching its schema.")}
                messages.append(repair)
                trace.record(Step(source="user", messages=[repair], ended_at=time.time(),
                                  extra={"repair": True}))
            else:
                state["malformed"] = 0
            state["turn"] += 1
            await self._save(run, state, "turn")
        trace.stop_reason = "max_steps"

    async def _save(self, run: Run, state: dict[str, Any], level: str) -> None:
        if self.checkpoints == "step" or (self.checkpoints == "turn" and level == "turn"):
            await run.checkpoint(state)

    async def _reply(self, trace: Any, http: httpx.AsyncClient, toolbox: _Toolbox,
                     messages: list[dict[str, Any]]) -> tuple[dict[str, Any], Any]:
        """One model request; records the reply as an agent step and appends it to ``messages``."""
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
        return message, choice.get("finish_reason")

    async def _run_call(self, trace: Any, toolbox: _Toolbox, call: dict[str, Any],
                        messages: list[dict[str, Any]]) -> str | None:
        """Run one tool call, record it; returns the problem when the call was malformed."""
        call_id = str(call.get("id") or f"call_{len(messages)}")
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        started = time.time()
        arguments: dict[str, Any] = {}
        error: str | None = None
        problem: str | None = None
        try:
            arguments = _parse_arguments(name, function.get("arguments"), toolbox)
            result = await self._call_tool(toolbox, name, arguments)
        except MalformedToolCall as exc:
            problem = str(exc)
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
        return problem

    async def _complete(self, http: httpx.AsyncClient, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]]) -> dict[str, Any]:
        """One chat-completions request. Failures raise :class:`ModelAPIError` (no retry loop
        here: the agent step is retried and resumes from its last checkpoint)."""
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
        try:
            response = await http.post("chat/completions", json=body)
        except httpx.TransportError as exc:  # includes timeouts
            raise ModelAPIError(f"chat completions request failed: {type(exc).__name__}: {exc}",
                                retryable=True) from None
        if response.status_code < 400:
            return dict(response.json())
        status = response.status_code
        raise ModelAPIError(f"chat completions answered {status}: {response.text[:500]}",
                            retryable=status in _RETRY_STATUS or status >= 500, status=status,
                            retry_after_s=_retry_after(response.headers.get("retry-after")))

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
                            "parameters": _input_schema(tool),
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


def _input_schema(tool: Any) -> dict[str, Any]:
    """An MCP tool's argument schema: ``input_schema`` in mcp 2 (fastmcp 4), ``inputSchema`` in
    mcp 1 (fastmcp 2 and 3, e.g. next to hud, which pins fastmcp 3)."""
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
    return dict(schema or {"type": "object"})


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


def _conversation(steps: list[Step]) -> list[dict[str, Any]]:
    """The messages after the prompt, rebuilt from a checkpointed trace: every reply, tool
    result and repair request, in order (the system/user prompt steps are rebuilt by the agent)."""
    out: list[dict[str, Any]] = []
    for step in steps:
        if step.source in ("agent", "tool") or (step.source == "user" and step.extra.get("repair")):
            out.extend(step.messages)
    return out


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


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
