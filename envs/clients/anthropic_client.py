"""Client on the official `anthropic` SDK (Messages API), aiohttp transport."""

from __future__ import annotations

import json
from typing import Any

import anthropic

try:  # the anthropic SDK's own httpx flavour (newer releases vendor `httpx2`)
    import httpx2 as _sdk_httpx
except ImportError:  # pragma: no cover - older SDKs use httpx itself
    import httpx as _sdk_httpx

from ..errors import InvalidModelResponseError
from ..types import Messages, Response, ResponseMessage, SamplingArgs, Tool, ToolCall, Usage
from .base import Client, classify_sdk_error, log_sdk_retries
from .config import ClientConfig, client_headers, resolve_api_key

DEFAULT_MAX_TOKENS = 4096
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
_ARGS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking", "tool_choice", "extra_headers", "extra_body", "timeout"})


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


class AnthropicMessagesClient(Client[anthropic.AsyncAnthropic]):
    """Anthropic Messages API: system prompt, tool_use / tool_result blocks."""

    def setup_client(self, config: ClientConfig) -> anthropic.AsyncAnthropic:
        timeout = anthropic.Timeout(config.timeout, connect=config.connect_timeout)
        limits = _sdk_httpx.Limits(max_connections=config.max_connections,
                              max_keepalive_connections=config.max_keepalive_connections)
        try:
            http_client = anthropic.DefaultAioHttpClient(timeout=timeout, limits=limits)
        except Exception:  # aiohttp extra missing: the SDK's httpx transport, same limits
            http_client = anthropic.DefaultAsyncHttpxClient(timeout=timeout, limits=limits)
        base = config.api_base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        log_sdk_retries("anthropic._base_client")
        return anthropic.AsyncAnthropic(
            api_key=resolve_api_key(config.api_key_var),
            base_url=base,
            timeout=timeout,
            max_retries=config.max_retries,
            default_headers=client_headers(config),
            http_client=http_client,
        )

    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]:
        if isinstance(messages, str):
            return [{"role": "user", "content": messages}], {}
        system: list[str] = []
        out: list[dict[str, Any]] = []

        def append(role: str, blocks: list[dict[str, Any]]) -> None:
            if out and out[-1]["role"] == role:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for m in messages:
            role = m.get("role")
            if role == "system" or role == "developer":
                system.append(_text(m.get("content")))
            elif role == "tool":
                append("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": _text(m.get("content"))}])
            elif role == "assistant":
                blocks: list[dict[str, Any]] = []
                if _text(m.get("content")):
                    blocks.append({"type": "text", "text": _text(m.get("content"))})
                for tc in m.get("tool_calls") or []:
                    fn = tc.get("function", {})
                    try:
                        args = json.loads(fn.get("arguments") or "{}")
                    except ValueError:
                        args = {}
                    blocks.append({"type": "tool_use", "id": tc.get("id"), "name": fn.get("name"), "input": args})
                if blocks:
                    append("assistant", blocks)
            else:
                content = m.get("content")
                blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
                append("user", blocks)
        extra = {"system": "\n\n".join(system)} if system else {}
        return out, extra

    def to_native_tool(self, tool: Tool) -> Any:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: SamplingArgs, tools: list[Any] | None, **kwargs: Any
    ) -> Any:
        args: dict[str, Any] = {}
        extra_body: dict[str, Any] = dict(sampling_args.pop("extra_body", None) or {})
        if "max_completion_tokens" in sampling_args:
            sampling_args.setdefault("max_tokens", sampling_args.pop("max_completion_tokens"))
        for key, value in sampling_args.items():
            if value is None:
                continue
            (args if key in _ARGS else extra_body)[key] = value
        if extra_body:
            args["extra_body"] = extra_body
        args.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        if tools:
            args["tools"] = tools
        if kwargs.get("system"):
            args["system"] = kwargs["system"]
        if kwargs.get("extra_headers"):
            args["extra_headers"] = {**args.get("extra_headers", {}), **kwargs["extra_headers"]}
        return await self._client.messages.create(model=model, messages=prompt, **args)

    def classify_error(self, exc: BaseException) -> BaseException:
        return classify_sdk_error(anthropic, exc)

    def raise_from_native_response(self, response: Any) -> None:
        if response is None or getattr(response, "content", None) is None:
            raise InvalidModelResponseError("anthropic response has no content")

    def from_native_response(self, response: Any) -> Response:
        texts, thinking, calls = [], [], []
        for block in response.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "thinking":
                thinking.append(getattr(block, "thinking", ""))
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input)))
        finish = _STOP.get(response.stop_reason or "", None)
        usage = None
        if response.usage is not None:
            p, c = response.usage.input_tokens or 0, response.usage.output_tokens or 0
            usage = Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)
        return Response(
            id=response.id or "",
            created=0,
            model=response.model or "",
            usage=usage,
            message=ResponseMessage(
                content="".join(texts) if texts or not calls else None,
                reasoning_content="".join(thinking) or None,
                finish_reason=finish,  # type: ignore[arg-type]
                is_truncated=finish == "length",
                tool_calls=calls or None,
            ),
        )
