"""Clients on the official `openai` SDK: chat completions and legacy completions.

The SDK client is built on openai's aiohttp transport (`DefaultAioHttpClient`):
at high concurrency httpx's pool scan is the bottleneck (see benchmarks)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from ..errors import EmptyModelResponseError, InvalidModelResponseError, ModelError
from ..types import Messages, Response, ResponseMessage, ResponseTokens, SamplingArgs, Tool, ToolCall, Usage
from .base import Client, classify_sdk_error, log_sdk_retries
from .config import ClientConfig, client_headers, resolve_api_key

# Arguments the chat/completions endpoints accept directly; the rest goes to extra_body.
_CHAT_ARGS = frozenset(
    {
        "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "presence_penalty",
        "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "seed", "response_format",
        "tool_choice", "parallel_tool_calls", "user", "reasoning_effort", "metadata", "store",
        "service_tier", "modalities", "prediction", "audio", "stream_options", "verbosity",
        "extra_headers", "extra_query", "extra_body", "timeout",
    }
)
_COMPLETION_ARGS = frozenset(
    {
        "max_tokens", "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty",
        "logit_bias", "logprobs", "seed", "suffix", "echo", "best_of", "user",
        "extra_headers", "extra_query", "extra_body", "timeout",
    }
)


def build_async_openai(config: ClientConfig) -> openai.AsyncOpenAI:
    """An AsyncOpenAI on the aiohttp transport configured from `config` (timeouts,
    connection limits, retries, headers, the key by variable name)."""
    timeout = openai.Timeout(config.timeout, connect=config.connect_timeout)
    log_sdk_retries("openai._base_client")
    limits = httpx.Limits(max_connections=config.max_connections,
                          max_keepalive_connections=config.max_keepalive_connections)
    try:
        http_client = openai.DefaultAioHttpClient(timeout=timeout, limits=limits)
    except Exception:  # aiohttp extra missing: fall back to the SDK's default transport
        http_client = openai.DefaultAsyncHttpxClient(timeout=timeout, limits=limits)
    return openai.AsyncOpenAI(
        api_key=resolve_api_key(config.api_key_var),
        base_url=config.api_base_url,
        timeout=timeout,
        max_retries=config.max_retries,
        default_headers=client_headers(config),
        http_client=http_client,
    )


def _split_args(sampling_args: SamplingArgs, allowed: frozenset[str]) -> dict[str, Any]:
    direct: dict[str, Any] = {}
    extra_body: dict[str, Any] = dict(sampling_args.pop("extra_body", None) or {})
    for key, value in sampling_args.items():
        if value is None:
            continue
        if key in allowed:
            direct[key] = value
        else:
            extra_body[key] = value
    if extra_body:
        direct["extra_body"] = extra_body
    return direct


def _classify_openai_error(exc: BaseException) -> BaseException:
    return classify_sdk_error(openai, exc)


async def post_json(client: openai.AsyncOpenAI, path: str, body: dict[str, Any], sampling_args: SamplingArgs,
                    tools: list[Any] | None, extra_headers: dict[str, str] | None = None,
                    renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """POST `body` plus the sampling args to `path` through the SDK's generic `post`
    (its transport, retries and typed errors) and return the parsed JSON reply.
    `extra_body` merges into the body, `extra_headers` / `extra_query` / `timeout`
    become request options, `renamed` maps sampling keys to this route's names."""
    options: dict[str, Any] = {}
    for key, value in sampling_args.items():
        if value is None:
            continue
        if key == "extra_body":
            body.update(value or {})
        elif key == "extra_headers":
            options["headers"] = {**options.get("headers", {}), **value}
        elif key == "extra_query":
            options["params"] = value
        elif key == "timeout":
            options["timeout"] = value
        else:
            body[(renamed or {}).get(key, key)] = value
    if tools:
        body["tools"] = tools
    if extra_headers:
        options["headers"] = {**options.get("headers", {}), **extra_headers}
    raw = await client.post(path, body=body, cast_to=bytes, options=options)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidModelResponseError(f"model response is not JSON: {raw[:200]!r}") from exc


def _response_tokens(response: dict[str, Any], choice: dict[str, Any]) -> ResponseTokens | None:
    """The engine's token ids and logprobs, when the server returned them (vLLM's
    `return_token_ids`: `prompt_token_ids`, the choice's `token_ids`)."""
    prompt_ids, completion_ids = response.get("prompt_token_ids"), choice.get("token_ids")
    if prompt_ids is None or completion_ids is None:
        return None
    logprobs = [float(t.get("logprob") or 0.0) for t in ((choice.get("logprobs") or {}).get("content") or [])]
    return ResponseTokens(prompt_ids=list(prompt_ids), prompt_mask=[0] * len(prompt_ids),
                          completion_ids=list(completion_ids), completion_mask=[1] * len(completion_ids),
                          completion_logprobs=logprobs)


class OpenAIChatCompletionsClient(Client[openai.AsyncOpenAI]):
    """OpenAI Chat Completions API (the default client)."""

    def setup_client(self, config: ClientConfig) -> openai.AsyncOpenAI:
        return build_async_openai(config)

    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]:
        if isinstance(messages, str):
            return [{"role": "user", "content": messages}], {}
        return messages, {}

    def to_native_tool(self, tool: Tool) -> Any:
        fn: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        if tool.strict is not None:
            fn["strict"] = tool.strict
        return {"type": "function", "function": fn}

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: SamplingArgs, tools: list[Any] | None, **kwargs: Any
    ) -> Any:
        # The request body is already plain JSON (OpenAI-format dicts), so we
        # post it through the SDK's generic `post` (same transport, retries and
        # typed errors) and skip `create()`'s per-request TypedDict transform
        # of the whole message list and the pydantic construction of the
        # reply: together they cost more CPU than the rest of a rollout at
        # high concurrency (see benchmarks/bench_eval.py).
        return await post_json(self._client, "/chat/completions", {"model": model, "messages": prompt}, sampling_args,
                               tools, kwargs.get("extra_headers"))

    def classify_error(self, exc: BaseException) -> BaseException:
        return _classify_openai_error(exc)

    def raise_from_native_response(self, response: Any) -> None:
        if not isinstance(response, dict):
            response = response.model_dump()  # a ChatCompletion from a caller's own SDK call
        if response.get("error"):
            raise InvalidModelResponseError(f"model endpoint returned an error: {response['error']}")
        choices = response.get("choices")
        if not choices or not isinstance(choices, list):
            raise InvalidModelResponseError("model response has no choices")
        msg = choices[0].get("message")
        if not isinstance(msg, dict):
            raise InvalidModelResponseError("model response has no message")
        if not msg.get("content") and not msg.get("tool_calls") and not msg.get("reasoning_content"):
            if choices[0].get("finish_reason") != "length":
                raise EmptyModelResponseError("model returned neither content nor tool calls")

    def from_native_response(self, response: Any) -> Response:
        if not isinstance(response, dict):
            response = response.model_dump()
        choice = response["choices"][0]
        msg = choice["message"]
        tool_calls = None
        if msg.get("tool_calls"):
            tool_calls = [
                ToolCall(id=tc.get("id") or "", name=tc["function"]["name"], arguments=tc["function"].get("arguments") or "{}")
                for tc in msg["tool_calls"]
            ]
        reason = choice.get("finish_reason")
        finish = reason if reason in ("stop", "length", "tool_calls") else None
        usage = None
        u = response.get("usage")
        if u:
            usage = Usage(
                prompt_tokens=u.get("prompt_tokens") or 0,
                completion_tokens=u.get("completion_tokens") or 0,
                total_tokens=u.get("total_tokens") or 0,
            )
        return Response(
            id=response.get("id") or "",
            created=response.get("created") or 0,
            model=response.get("model") or "",
            usage=usage,
            message=ResponseMessage(
                content=msg.get("content"),
                reasoning_content=msg.get("reasoning_content") or msg.get("reasoning"),
                finish_reason=finish,
                is_truncated=reason == "length",
                tool_calls=tool_calls,
                tokens=_response_tokens(response, choice),
            ),
        )


class OpenAICompletionsClient(Client[openai.AsyncOpenAI]):
    """OpenAI legacy Completions API (message_type="completion")."""

    def setup_client(self, config: ClientConfig) -> openai.AsyncOpenAI:
        return build_async_openai(config)

    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]:
        if isinstance(messages, str):
            return messages, {}
        return "\n".join(str(m.get("content") or "") for m in messages), {}

    def to_native_tool(self, tool: Tool) -> Any:
        raise ModelError("the completions API does not support tools")

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: SamplingArgs, tools: list[Any] | None, **kwargs: Any
    ) -> Any:
        args = _split_args(sampling_args, _COMPLETION_ARGS)
        headers = kwargs.get("extra_headers")
        if headers:
            args["extra_headers"] = {**args.get("extra_headers", {}), **headers}
        return await self._client.completions.create(model=model, prompt=prompt, **args)

    def classify_error(self, exc: BaseException) -> BaseException:
        return _classify_openai_error(exc)

    def raise_from_native_response(self, response: Any) -> None:
        if response is None or not getattr(response, "choices", None):
            raise InvalidModelResponseError("completion response has no choices")

    def from_native_response(self, response: Any) -> Response:
        choice = response.choices[0]
        usage = None
        if response.usage is not None:
            usage = Usage(
                prompt_tokens=response.usage.prompt_tokens or 0,
                completion_tokens=response.usage.completion_tokens or 0,
                total_tokens=response.usage.total_tokens or 0,
            )
        finish = choice.finish_reason if choice.finish_reason in ("stop", "length") else None
        return Response(
            id=response.id or "",
            created=response.created or 0,
            model=response.model or "",
            usage=usage,
            message=ResponseMessage(content=choice.text, finish_reason=finish, is_truncated=finish == "length"),
        )


def tool_call_to_dict(tc: ToolCall) -> dict[str, Any]:
    return {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}


def parse_arguments(arguments: str) -> Any:
    return json.loads(arguments) if arguments else {}
