"""`OpenAIChatCompletionsTokenClient` (`client_type = "openai_chat_completions_token"`):
chat completions that keep the model's own tokens across turns, vLLM's
token-in / token-out route.

Every request asks for token ids and logprobs (`return_token_ids`,
`logprobs`); the response's `prompt_token_ids` / `token_ids` / logprobs
become the trajectory step's `tokens`. From the second turn on the prompt is
not re-tokenized from messages: the ids of the longest earlier step whose
messages are a prefix of this prompt (its prompt + completion ids, exactly
as the engine produced them) are kept, and only the new messages after them
(tool results, then possibly a user message) are tokenized with the
server's `/tokenize`, as a "bridge". The request then goes to
`/v1/chat/completions/tokens` with those ids in `tokens`. The bridge is
rendered behind a dummy assistant message, so the template's separator
after an assistant turn is right, and the tokens the template puts after the
stop token are kept (the "gap"). Whenever stitching is not possible (first
turn, no prefix match, a truncated previous turn, new messages that are not
tool results + one user message, multimodal content, a tokenize failure) the
request falls back to the plain chat route with the same sampling args.

The client needs the rollout's state (its trajectory): callers pass
`state=` to `get_response` when a client sets `wants_state` (Environment and
the v1 interception endpoint do).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from openai.types.chat import ChatCompletion

from ..types import SamplingArgs
from .openai_clients import OpenAIChatCompletionsClient

log = logging.getLogger(__name__)

TOKENS_ROUTE = "/chat/completions/tokens"


def _has_media(messages: Any) -> bool:
    for msg in messages or ():
        content = msg.get("content") if hasattr(msg, "get") else None
        if isinstance(content, list) and any(
                hasattr(p, "get") and p.get("type") in ("image_url", "input_audio") for p in content):
            return True
    return False


def _comparable(value: Any) -> Any:
    """Plain data for comparing messages; content "" and None are the same."""
    if hasattr(value, "model_dump"):
        return _comparable(value.model_dump())
    if isinstance(value, Mapping):
        out = {str(k): _comparable(v) for k, v in value.items()}
        if out.get("content") == "":
            out["content"] = None
        return out
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _role(msg: Any) -> Any:
    return msg.get("role") if hasattr(msg, "get") else getattr(msg, "role", None)


def _bridgeable(new: list[Any]) -> bool:
    """The messages after the stitched step can be bridged: tool results, then a last tool or user message."""
    roles = [_role(m) for m in new]
    return bool(new) and all(r == "tool" for r in roles[:-1]) and roles[-1] in ("tool", "user")


def _dummy_assistant(new: list[Any]) -> dict[str, Any]:
    """A stand-in for the stitched step's assistant message, rendered before `new` to find the bridge: it
    calls the tools whose results lead `new` (by their ids), else has plain content."""
    call_ids = []
    for msg in new:
        if _role(msg) != "tool":
            break
        call_id = msg.get("tool_call_id") if hasattr(msg, "get") else getattr(msg, "tool_call_id", None)
        if call_id:
            call_ids.append(call_id)
    dummy: dict[str, Any] = {"role": "assistant", "reasoning_content": ""}
    if call_ids:
        dummy["tool_calls"] = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                               for i in call_ids]
    else:
        dummy["content"] = "x"
    return dummy


def _bridge(full: list[int], base: list[int], stop: int) -> list[int]:
    """The tokens to append after the engine's ids (ending in `stop`): `full` (dummy + new messages) past
    `base` (the dummy alone), backed up over template tokens the template puts after the stop token."""
    gap = 0  # template tokens after the stop token (e.g. a newline), not in the engine's ids
    for i in range(len(base) - 1, -1, -1):
        if base[i] == stop:
            gap = len(base) - i - 1
            break
    bridge = full[len(base) - gap:]
    if bridge and bridge[0] == stop:  # a stop token that is also the next role's marker
        bridge = bridge[1:]
    return list(bridge)


def token_sampling_args(sampling_args: SamplingArgs) -> dict[str, Any]:
    """The sampling args of a token-route request: logprobs and token ids asked for,
    `max_tokens` under the chat route's current name."""
    args = dict(sampling_args)
    if "max_tokens" in args:
        args["max_completion_tokens"] = args.pop("max_tokens")
    args["logprobs"] = True
    args["extra_body"] = {**(args.get("extra_body") or {}), "return_token_ids": True}
    return {k: v for k, v in args.items() if v is not None}


class OpenAIChatCompletionsTokenClient(OpenAIChatCompletionsClient):
    """vLLM's token route (see the module docstring)."""

    wants_state = True

    @property
    def token_client(self) -> Any:
        """The SDK client rooted at the server (no /v1): `/tokenize` lives there."""
        base = str(self.client.base_url).rstrip("/")
        return self.client.with_options(base_url=base[:-3] if base.endswith("/v1") else base)

    async def get_native_response(self, prompt: Any, model: str, sampling_args: SamplingArgs,
                                  tools: list[Any] | None = None, **kwargs: Any) -> Any:
        args = token_sampling_args(sampling_args)
        state = kwargs.pop("state", None)
        extra_headers = kwargs.pop("extra_headers", None)
        trajectory = (state.get("trajectory") if state is not None else None) or []
        if not trajectory or _has_media(prompt) or any(_has_media(step["prompt"]) for step in trajectory):
            return await super().get_native_response(prompt, model, args, tools, extra_headers=extra_headers)
        template_kwargs = args["extra_body"].get("chat_template_kwargs") or {}
        prompt_ids = await self.get_prompt_ids(state, prompt, tools, chat_template_kwargs=template_kwargs)
        if prompt_ids is None:
            log.warning("token route: could not stitch turn %d onto the previous tokens; sent as messages",
                        len(trajectory) + 1)
            return await super().get_native_response(prompt, model, args, tools, extra_headers=extra_headers)
        extra_body = args.pop("extra_body", {})
        body = {"model": model, "messages": prompt, "tools": tools, "tokens": prompt_ids, **args, **extra_body}
        raw = await self.client.post(TOKENS_ROUTE, body=body, cast_to=httpx.Response,
                                     options={"headers": extra_headers} if extra_headers else {})
        return ChatCompletion.model_validate_json(raw.content)

    async def _native_messages(self, messages: Any) -> Any:
        native = self.to_native_prompt(messages)
        if inspect.isawaitable(native):
            native = await native
        return native[0]

    async def _best_prefix(self, state: Any, prompt: list[Any]) -> tuple[Any, int] | None:
        """The trajectory step with tokens whose messages are the longest prefix of `prompt`."""
        target = _comparable(prompt)
        best, best_len = None, 0
        for step in reversed(state["trajectory"]):
            if step.get("tokens") is None:
                continue
            messages = _comparable(await self._native_messages([*step["prompt"], *step["completion"]]))
            n = len(messages)
            if n <= best_len or n > len(target) or target[:n] != messages:
                continue
            best, best_len = step, n
            if n == len(target):
                break
        return (best, best_len) if best is not None else None

    async def get_prompt_ids(self, state: Any, prompt_messages: Any, oai_tools: list[Any] | None,
                             chat_template_kwargs: dict[str, Any] | None = None) -> list[int] | None:
        """The next turn's prompt ids: an earlier step's engine ids + the bridge tokens
        of the messages after it; None when stitching is not possible."""
        found = await self._best_prefix(state, list(prompt_messages))
        if found is None:
            return None
        step, prefix_len = found
        tokens = step["tokens"]
        previous = list(tokens["prompt_ids"]) + list(tokens["completion_ids"])
        response = step.get("response")
        if tokens.get("is_truncated") or (response is not None and getattr(response.message, "is_truncated", False)):
            return None  # a truncated completion has no stop token to stitch after
        new = list(prompt_messages[prefix_len:])
        if not _bridgeable(new):
            return None
        dummy = _dummy_assistant(new)
        forwarded = {"chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else {}
        model = state.get("model") or ""
        try:
            full = await self.tokenize(messages=[dummy, *new], tools=oai_tools, model=model,
                                       extra_kwargs=dict(forwarded))
            base = await self.tokenize(messages=[dummy], tools=oai_tools, model=model,
                                       extra_kwargs=dict(add_generation_prompt=False, **forwarded))
        except Exception as exc:
            log.debug("token route: bridge tokenization failed (%s); sent as messages", exc)
            return None
        if full[: len(base)] != base:
            return None  # the template does not render the dummy the same way with and without what follows
        return previous + _bridge(full, base, previous[-1])

    async def tokenize(self, messages: Any, tools: list[Any] | None, model: str,
                       extra_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> list[int]:
        """Token ids of `messages` (or a prompt string) from the server's `/tokenize`."""
        body: dict[str, Any] = {"model": model, **(extra_kwargs or {})}
        if isinstance(messages, str):
            body["prompt"] = messages
        else:
            body.update(messages=messages, tools=tools)
        raw = await self.token_client.post("/tokenize", body=body, cast_to=httpx.Response)
        return list(raw.json()["tokens"])
