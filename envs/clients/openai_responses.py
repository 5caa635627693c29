"""`OpenAIResponsesClient` (client_type "openai_responses"): the OpenAI Responses
API (`POST /responses`) on the official SDK's transport. Chat messages become
Responses input items (assistant tool calls -> `function_call`, tool results ->
`function_call_output`); the output items come back as one vf Response."""

from __future__ import annotations

from typing import Any

import openai

from ..errors import EmptyModelResponseError, InvalidModelResponseError
from ..types import Messages, Response, ResponseMessage, SamplingArgs, Tool, ToolCall, Usage
from .base import Client
from .config import ClientConfig
from .openai_clients import _classify_openai_error, build_async_openai, post_json

_RENAMED = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"))


def messages_to_input(messages: Messages) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id") or "", "output": _text(m.get("content"))})
            continue
        if role == "assistant":
            if m.get("content"):
                items.append({"role": "assistant", "content": _text(m.get("content"))})
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function", tc)
                items.append({"type": "function_call", "call_id": tc.get("id") or "", "name": fn["name"],
                              "arguments": fn.get("arguments") or "{}"})
            continue
        content = m.get("content")
        items.append({"role": role, "content": content if isinstance(content, str) else [
            {"type": "input_text", "text": p.get("text", "")} if p.get("type") == "text"
            else {"type": "input_image", "image_url": (p.get("image_url") or {}).get("url")}
            for p in content or [] if isinstance(p, dict)]})
    return items


class OpenAIResponsesClient(Client[openai.AsyncOpenAI]):
    """OpenAI Responses API."""

    def setup_client(self, config: ClientConfig) -> openai.AsyncOpenAI:
        return build_async_openai(config)

    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]:
        return messages_to_input(messages), {}

    def to_native_tool(self, tool: Tool) -> Any:
        out: dict[str, Any] = {"type": "function", "name": tool.name, "description": tool.description,
                               "parameters": tool.parameters}
        if tool.strict is not None:
            out["strict"] = tool.strict
        return out

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: SamplingArgs, tools: list[Any] | None, **kwargs: Any
    ) -> Any:
        return await post_json(self._client, "/responses", {"model": model, "input": prompt}, sampling_args, tools,
                               kwargs.get("extra_headers"), renamed=_RENAMED)

    def classify_error(self, exc: BaseException) -> BaseException:
        return _classify_openai_error(exc)

    def raise_from_native_response(self, response: Any) -> None:
        if not isinstance(response, dict):
            response = response.model_dump()
        if response.get("error") or response.get("status") == "failed":
            raise InvalidModelResponseError(f"model endpoint returned an error: {response.get('error')}")
        output = response.get("output")
        if not isinstance(output, list):
            raise InvalidModelResponseError("model response has no output")
        if not output and response.get("status") != "incomplete":
            raise EmptyModelResponseError("model returned no output items")

    def from_native_response(self, response: Any) -> Response:
        if not isinstance(response, dict):
            response = response.model_dump()
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        for item in response.get("output") or []:
            kind = item.get("type")
            if kind == "message":
                texts.append(_text(item.get("content")))
            elif kind == "function_call":
                calls.append(ToolCall(id=item.get("call_id") or item.get("id") or "", name=item["name"],
                                      arguments=item.get("arguments") or "{}"))
            elif kind == "reasoning":
                reasoning.extend(s.get("text", "") for s in item.get("summary") or [])
        truncated = response.get("status") == "incomplete"
        finish = "length" if truncated else ("tool_calls" if calls else "stop")
        u = response.get("usage") or None
        usage = Usage(prompt_tokens=u.get("input_tokens") or 0, completion_tokens=u.get("output_tokens") or 0,
                      total_tokens=u.get("total_tokens") or 0) if u else None
        return Response(
            id=response.get("id") or "", created=int(response.get("created_at") or 0), model=response.get("model") or "",
            usage=usage,
            message=ResponseMessage(content="".join(texts) or None, reasoning_content="".join(reasoning) or None,
                                    finish_reason=finish, is_truncated=truncated, tool_calls=calls or None),
        )
