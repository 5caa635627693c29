"""The v1 interception endpoint: every model call of a harness goes through it.

A small HTTP server on 127.0.0.1 speaking OpenAI chat completions
(`/v1/chat/completions`), OpenAI Responses (`/v1/responses`) and Anthropic
Messages (`/v1/messages`), each translated to the rollout's one client, and
`/v1/models`. Each rollout registers under a fresh bearer key; a request with
that key is answered by the rollout's vf `Client` with the rollout's model and
sampling args (the run's sampling args win over the program's), and recorded
as a trajectory step of the rollout's state (prompt, completion, response,
usage, model time). In-process programs reach it with `state.get_client()`,
local commands through OPENAI_BASE_URL / OPENAI_API_KEY, sandboxed commands
through the relay over the sandbox's own command channel (`sandbox_relay`).

Tool forwarding: `GET /v1/vf/tools` lists the rollout's tools and
`POST /v1/vf/tools/<name>` (JSON arguments) runs one on the host, bindings
applied, answering {"content": result} or {"error": "Type: message"}; the
in-sandbox State's `get_tools()` and any command program use it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..errors import Error, error_text
from ..multi_turn import response_to_message, step_tokens
from ..protocols import anthropic_to_chat, responses_to_chat, tools_of
from ..types import Response, TimeSpan, Tool, add_usage

log = logging.getLogger(__name__)

_NOT_SAMPLING = frozenset({"model", "messages", "tools", "tool_choice", "stream", "stream_options", "n"})


@dataclass
class Registration:
    state: Any  # envs.v1.state.State
    client: Any  # envs.clients.Client
    model: str
    sampling_args: dict[str, Any] = field(default_factory=dict)
    calls: int = 0


def _tool_from_openai(spec: dict[str, Any]) -> Tool:
    fn = spec.get("function", spec)
    return Tool(name=fn["name"], description=fn.get("description") or "",
                parameters=fn.get("parameters") or {"type": "object", "properties": {}}, strict=fn.get("strict"))


def _openai_body(response: Response, model: str) -> dict[str, Any]:
    msg = response_to_message(response)
    usage = response.usage
    finish = response.message.finish_reason or ("tool_calls" if msg.get("tool_calls") else "stop")
    return {
        "id": response.id or f"chatcmpl-{secrets.token_hex(6)}",
        "object": "chat.completion",
        "created": response.created or int(time.time()),
        "model": response.model or model,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "total_tokens": usage.total_tokens or usage.prompt_tokens + usage.completion_tokens}
        if usage else None,
    }


class InterceptionServer:
    """One endpoint per Harness process; rollouts register and unregister."""

    def __init__(self) -> None:
        self._regs: dict[str, Registration] = {}
        self._runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()
        self.base_url = ""

    async def start(self) -> str:
        async with self._lock:
            if self._runner is None:
                app = web.Application(client_max_size=64 * 1024 * 1024)
                app.router.add_post("/v1/chat/completions", self._chat)
                app.router.add_post("/v1/responses", self._responses)
                app.router.add_post("/v1/messages", self._messages)
                app.router.add_get("/v1/models", self._models)
                app.router.add_get("/v1/vf/tools", self._tools)
                app.router.add_post("/v1/vf/tools/{name}", self._tool_call)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                self._runner = runner
                self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def register(self, reg: Registration) -> str:
        key = "vf-" + secrets.token_hex(16)
        self._regs[key] = reg
        return key

    def unregister(self, key: str) -> None:
        self._regs.pop(key, None)

    def _reg_of(self, request: web.Request) -> Registration | None:
        auth = request.headers.get("Authorization", "")
        key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("x-api-key", "")
        return self._regs.get(key)

    async def _models(self, request: web.Request) -> web.Response:
        reg = self._reg_of(request)
        if reg is None:
            return _error(401, "unknown rollout key")
        return web.json_response({"object": "list", "data": [{"id": reg.model, "object": "model"}]})

    async def _tools(self, request: web.Request) -> web.Response:
        """The rollout's tools: {"tools": [{"name", "description", "parameters"}]}."""
        reg = self._reg_of(request)
        if reg is None:
            return _error(401, "unknown rollout key")
        defs = reg.state.runtime.get("tool_defs") or []
        return web.json_response({"tools": [{"name": d.name, "description": d.description, "parameters": d.parameters}
                                            for d in defs]})

    async def _tool_call(self, request: web.Request) -> web.Response:
        """Run one of the rollout's tools on the host (bindings applied) with the JSON body
        as its arguments: {"content": result} or {"error": "Type: message"}."""
        reg = self._reg_of(request)
        if reg is None:
            return _error(401, "unknown rollout key")
        name = request.match_info["name"]
        fn = (reg.state.runtime.get("tools") or {}).get(name)
        if fn is None:
            return _error(404, f"no tool {name!r}; the rollout has {sorted(reg.state.runtime.get('tools') or {})}")
        try:
            args = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the body is not JSON")
        if not isinstance(args, dict):
            return _error(400, "the body must be a JSON object of arguments")
        try:
            result = await fn(**args)
        except Exception as exc:  # the caller's feedback, as for a tool the base loop runs
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"})
        return web.json_response({"content": _jsonable(result)})

    async def _request(self, request: web.Request) -> tuple[Registration, dict[str, Any]] | web.Response:
        reg = self._reg_of(request)
        if reg is None:
            return _error(401, "unknown rollout key (the rollout ended or the key is wrong)")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        if body.get("stream"):
            return _error(400, "streaming is not supported by the v1 endpoint")
        return reg, body

    async def _responses(self, request: web.Request) -> web.Response:
        """The OpenAI Responses API, translated: the same model call and trajectory step."""
        got = await self._request(request)
        if isinstance(got, web.Response):
            return got
        reg, body = got
        args = {k: body[k] for k in ("temperature", "top_p") if body.get(k) is not None}
        if body.get("max_output_tokens") is not None:
            args["max_tokens"] = body["max_output_tokens"]
        return await self._answer(reg, responses_to_chat(body), tools_of(body, "responses"), args, _responses_body)

    async def _messages(self, request: web.Request) -> web.Response:
        """The Anthropic Messages API, translated: the same model call and trajectory step."""
        got = await self._request(request)
        if isinstance(got, web.Response):
            return got
        reg, body = got
        args = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k") if body.get(k) is not None}
        if body.get("stop_sequences"):
            args["stop"] = body["stop_sequences"]
        return await self._answer(reg, anthropic_to_chat(body), tools_of(body, "anthropic"), args, _anthropic_body)

    async def _chat(self, request: web.Request) -> web.Response:
        got = await self._request(request)
        if isinstance(got, web.Response):
            return got
        reg, body = got
        messages = body.get("messages")
        if not isinstance(messages, list):
            return _error(400, "messages must be a list")
        args = {k: v for k, v in body.items() if k not in _NOT_SAMPLING}
        return await self._answer(reg, messages, body.get("tools") or [], args, _openai_body)

    async def _answer(self, reg: Registration, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]],
                      args: dict[str, Any], render: Any) -> web.Response:
        """Ask the rollout's client (the run's model and sampling args win), record the step,
        answer in the caller's API (`render(response, model)`)."""
        tools = [_tool_from_openai(t) for t in tool_specs] or None
        args = {**args, **reg.sampling_args}
        state = reg.state
        t0 = time.time()
        try:
            extra = {"state": state} if getattr(reg.client, "wants_state", False) else {}
            response = await reg.client.get_response(messages, reg.model, args, tools, **extra)
        except Error as exc:  # the rollout's error unless a later call succeeds (harness.rollout_error)
            state.runtime["model_error"] = exc
            return _error(502, error_text(exc) or "model error")
        state.runtime.pop("model_error", None)
        t1 = time.time()
        reg.calls += 1
        self._record(state, messages, response, t0, t1)
        return web.json_response(render(response, reg.model))

    @staticmethod
    def _record(state: Any, messages: list[dict[str, Any]], response: Response, t0: float, t1: float) -> None:
        truncated = bool(response.message.is_truncated) or response.message.finish_reason == "length"
        state["trajectory"].append({
            "prompt": messages, "completion": [response_to_message(response)], "response": response,
            "tokens": step_tokens(response), "reward": None, "advantage": None, "is_truncated": truncated,
            "trajectory_id": state["trajectory_id"], "extras": {},
        })
        if truncated:
            state._set("is_truncated", True)
        timing = state.get("timing")
        if timing is not None:
            timing.model.spans.append(TimeSpan(start=t0, end=t1))
        if response.usage is not None:
            add_usage(state, response.usage)


def _anthropic_body(response: Response, model: str) -> dict[str, Any]:
    """`response` as an Anthropic Messages reply."""
    msg = response.message
    content: list[dict[str, Any]] = [{"type": "text", "text": msg.content}] if msg.content else []
    for call in msg.tool_calls or []:
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError:
            args = {}
        content.append({"type": "tool_use", "id": call.id or f"toolu_{secrets.token_hex(6)}", "name": call.name,
                        "input": args})
    stop = "tool_use" if msg.tool_calls else ("max_tokens" if msg.finish_reason == "length" else "end_turn")
    usage = response.usage
    return {"id": response.id or f"msg_{secrets.token_hex(6)}", "type": "message", "role": "assistant",
            "model": response.model or model, "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": usage.prompt_tokens if usage else 0,
                      "output_tokens": usage.completion_tokens if usage else 0}}


def _responses_body(response: Response, model: str) -> dict[str, Any]:
    """`response` as an OpenAI Responses reply."""
    msg = response.message
    rid = response.id or secrets.token_hex(6)
    output: list[dict[str, Any]] = []
    if msg.reasoning_content:
        output.append({"type": "reasoning", "id": f"rs_{rid}",
                       "summary": [{"type": "summary_text", "text": msg.reasoning_content}]})
    if msg.content:
        output.append({"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": msg.content, "annotations": []}]})
    for call in msg.tool_calls or []:
        cid = call.id or f"call_{secrets.token_hex(6)}"
        output.append({"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": call.name,
                       "arguments": call.arguments or "{}", "status": "completed"})
    truncated = msg.finish_reason == "length"
    usage = response.usage
    p, c = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
    return {"id": f"resp_{rid}", "object": "response", "created_at": response.created or int(time.time()),
            "model": response.model or model, "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "output": output, "usage": {"input_tokens": p, "output_tokens": c, "total_tokens": p + c}}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        text=json.dumps({"error": {"message": message, "type": "vf_interception", "code": status}}))
