"""`RendererClient` (`client_type = "renderer"`): token-in generation with the
prompt tokenized on the client by a renderer of the `renderers` package (the
optional extra `vf-sandbox[renderers]`), as the reference's RendererClient.

The renderer (the model's chat template as Python: messages -> token ids,
completion ids -> content / reasoning / tool calls) is built once per model
from its tokenizer: `ClientConfig.renderer_model_name` (a Hugging Face name
or a local directory with `tokenizer.json`; default: the request's model),
loaded by `renderers.load_tokenizer` (transformers), and
`ClientConfig.renderer_config` (a mapping of one of `renderers.RendererConfig`'s
variants, e.g. `{"name": "qwen3", "enable_thinking": false}`; default: picked
from the model name). `preserve_all_thinking` / `preserve_thinking_between_tool_calls`
are forwarded to it as `renderers`' `thinking_retention` ("all" / "tool_cycle":
whether earlier turns' sampled thinking stays in later prompts; neither: the
template's own policy). A ready renderer can be passed instead:
`RendererClient(config, renderer=...)`.

Each request posts the prompt's ids to the server's `/inference/v1/generate`
(vLLM's token-in route, via `renderers.client.generate`) and parses the
completion ids with the renderer. From the second turn on, the ids of the
longest earlier step whose messages prefix this prompt are kept exactly as
sampled and only the new messages (tool results, then possibly one user
message) are rendered after them (`Renderer.bridge_to_next_turn`); when the
renderer cannot extend them (its thinking-retention policy at a new user
turn, a truncated turn, a multimodal renderer, anything else) the prompt is
rendered in full.
Rendering runs in a worker thread, never on the event loop. The response's
`tokens` carry the prompt and completion ids and the completion logprobs.
The client needs the rollout's state (its trajectory): `wants_state`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from sandboxes.errors import ConfigError

from ..errors import EmptyModelResponseError, InvalidModelResponseError, OverlongPromptError
from ..types import ClientConfig, Messages, Response, ResponseMessage, ResponseTokens, SamplingArgs, ToolCall, Usage
from .openai_clients import OpenAIChatCompletionsClient

log = logging.getLogger(__name__)

EXTRA = "renderers"
"""The optional dependency group that installs the `renderers` package."""

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "n", "repetition_penalty", "min_tokens",
                  "presence_penalty", "frequency_penalty", "stop")
_HANDLED_KEYS = frozenset({*_SAMPLING_KEYS, "max_tokens", "max_completion_tokens", "extra_body", "extra_headers",
                           "cache_salt", "priority", "logprobs"})
_warned: set[str] = set()


def require_renderers() -> Any:
    """The `renderers` package, or a ConfigError naming the extra that installs it."""
    try:
        import renderers
        import renderers.client  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"client type 'renderer' needs the `renderers` package ({exc}); install it with "
                          f"`uv pip install 'vf-sandbox[{EXTRA}]'` (or `pip install 'vf-sandbox[{EXTRA}]'`)") from exc
    return renderers


def thinking_retention(config: ClientConfig | None) -> str | None:
    """`renderers`' thinking_retention for the ClientConfig's preserve_* flags (None: the template's)."""
    if config is None:
        return None
    if config.preserve_all_thinking:
        return "all"
    if config.preserve_thinking_between_tool_calls:
        return "tool_cycle"
    return None


def renderer_config(config: ClientConfig | None) -> Any:
    """The typed renderer config: `ClientConfig.renderer_config` (auto when unset) with
    the preserve_* flags as its thinking_retention."""
    renderers = require_renderers()
    from pydantic import TypeAdapter, ValidationError

    data = dict(config.renderer_config or {}) if config is not None else {}
    data.setdefault("name", "auto")
    retention = thinking_retention(config)
    if retention is not None:
        if data.get("thinking_retention") not in (None, retention):
            raise ConfigError(f"renderer_config.thinking_retention={data['thinking_retention']!r} conflicts with "
                              f"the preserve_* flags (thinking_retention={retention!r})")
        data["thinking_retention"] = retention
    try:
        return TypeAdapter(renderers.RendererConfig).validate_python(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid renderer_config {data}: {exc}") from exc


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def renderer_messages(messages: Messages) -> list[dict[str, Any]]:
    """Messages as the renderer takes them (plain dicts, None fields dropped); a tool
    result gets the `name` of the call it answers (some templates print it)."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    out = [_plain(m) for m in messages]
    names: dict[str, str] = {}
    for m in out:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(fn, Mapping) and call.get("id") and fn.get("name"):
                    names[call["id"]] = fn["name"]
        elif m.get("role") == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
    return out


def _comparable(value: Any, key: str | None = None) -> Any:
    """Plain data for matching messages: tool arguments as parsed JSON, content "" as absent."""
    if key == "arguments" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, Mapping):
        return {str(k): _comparable(v, str(k)) for k, v in value.items()
                if v is not None and not (k == "content" and v == "")}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _valid_tail(messages: list[dict[str, Any]]) -> bool:
    """What a bridge may add: tool results, then at most one user message."""
    roles = [m.get("role") for m in messages]
    if not roles:
        return False
    if roles[-1] == "user":
        roles = roles[:-1]
    return all(r == "tool" for r in roles)


def _step_ids(step: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
    tokens = step.get("tokens")
    if tokens is None:
        response = step.get("response")
        message = getattr(response, "message", None)
        tokens = getattr(message, "tokens", None)
    if tokens is None:
        return None
    prompt_ids, completion_ids = tokens.get("prompt_ids"), tokens.get("completion_ids")
    if not prompt_ids or not completion_ids:
        return None
    return list(prompt_ids), list(completion_ids)


class RendererClient(OpenAIChatCompletionsClient):
    """Client-side tokenization with a renderer, token-in generation (see the module docstring)."""

    wants_state = True
    _shared: ClassVar[dict[tuple[str, str, str | None], Any]] = {}
    """Renderers by (tokenizer, renderer config, template kwargs), shared by every instance
    of the process (the clients of an endpoint's replicas, of several envs): a tokenizer
    is loaded once."""
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, client_or_config: Any, renderer: Any = None) -> None:
        require_renderers()
        config = client_or_config if isinstance(client_or_config, ClientConfig) else None
        if renderer is not None and thinking_retention(config) is not None:
            raise ConfigError("preserve_* flags configure the renderer the client builds; a renderer passed in "
                              "is used as it is: build it with thinking_retention instead")
        self._renderer_config = renderer_config(config)  # a bad one fails here, not at the first request
        self._renderer_config_json = self._renderer_config.model_dump_json()
        super().__init__(client_or_config)
        self._renderer = renderer

    # ---- the renderer
    def _renderer_key(self, model: str, chat_template_kwargs: Mapping[str, Any] | None) -> tuple[str, str, str | None]:
        name = (self.config.renderer_model_name if self.config is not None else None) or model
        return (name, self._renderer_config_json,
                json.dumps(chat_template_kwargs, sort_keys=True) if chat_template_kwargs else None)

    def _build_renderer(self, key: tuple[str, str, str | None], chat_template_kwargs: Mapping[str, Any] | None) -> Any:
        name = key[0]
        with self._shared_lock:  # one build per key (loading a tokenizer takes seconds)
            if key not in self._shared:
                renderers = require_renderers()
                from renderers.base import load_tokenizer

                try:
                    tokenizer = load_tokenizer(name)
                except ImportError as exc:
                    raise ConfigError(f"loading the tokenizer of {name!r} needs transformers: install "
                                      f"vf-sandbox[{EXTRA}] ({exc})") from exc
                except OSError as exc:  # not a local directory, and the hub did not serve it
                    raise ConfigError(f"cannot load the tokenizer {name!r} (renderer_model_name: a Hugging "
                                      f"Face name or a local directory with tokenizer.json): {exc}") from exc
                try:
                    self._shared[key] = renderers.create_renderer(tokenizer, self._renderer_config,
                                                                  chat_template_kwargs=chat_template_kwargs)
                except (ValueError, TypeError, NotImplementedError, ImportError) as exc:
                    raise ConfigError(f"cannot build a renderer for {name!r}: {exc}") from exc
            return self._shared[key]

    async def renderer_for(self, model: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> Any:
        """The renderer of `model` (the one passed in, else built once, in a thread)."""
        if self._renderer is not None:
            if chat_template_kwargs:
                raise ConfigError("chat_template_kwargs configure the renderer the client builds; "
                                  "a renderer passed in is used as it is")
            return self._renderer
        key = self._renderer_key(model, chat_template_kwargs)
        built = self._shared.get(key)
        return built if built is not None else await asyncio.to_thread(self._build_renderer, key, chat_template_kwargs)

    # ---- conversions
    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]:
        return renderer_messages(messages), {}

    async def bridged_prompt(self, renderer: Any, prompt: list[dict[str, Any]], state: Any,
                             tools: list[Any] | None) -> Any:
        """The next turn's prompt (renderers' RenderedTokens) extending the latest earlier step
        whose messages prefix `prompt`; None when there is none or the renderer cannot extend it."""
        trajectory = (state.get("trajectory") if state is not None else None) or []
        if require_renderers().is_multimodal(renderer):
            return None  # its bridge needs the earlier turns' media data, which steps do not keep: render in full
        target = _comparable(prompt)
        for step in reversed(list(trajectory)):
            ids = _step_ids(step)
            if ids is None:
                continue
            previous = renderer_messages([*step.get("prompt", []), *step.get("completion", [])])
            n = len(previous)
            if not previous or n >= len(prompt) or target[:n] != _comparable(previous):
                continue
            tail = prompt[n:]
            if not _valid_tail(tail):
                continue
            return await asyncio.to_thread(renderer.bridge_to_next_turn, ids[0], ids[1], tail, tools=tools)
        return None

    async def get_native_response(self, prompt: Any, model: str, sampling_args: SamplingArgs,
                                  tools: list[Any] | None = None, **kwargs: Any) -> Any:
        renderers = require_renderers()
        from renderers.client import generate

        args = dict(sampling_args)
        state = kwargs.pop("state", None)
        headers = {**dict(args.pop("extra_headers", None) or {}), **dict(kwargs.pop("extra_headers", None) or {})}
        params: dict[str, Any] = dict(args.pop("extra_body", None) or {})
        renderer = await self.renderer_for(model, params.pop("chat_template_kwargs", None))
        for key in _SAMPLING_KEYS:
            if args.get(key) is not None:
                params[key] = args[key]
        dropped = sorted(k for k, v in args.items() if v is not None and k not in _HANDLED_KEYS and k not in _warned)
        if dropped:  # chat-API settings with no sampling-param twin (tool_choice, reasoning_effort, ...)
            _warned.update(dropped)
            log.warning("renderer client: sampling args %s have no meaning for token-in generation and are not "
                        "sent (engine sampling params go in extra_body)", dropped)
        max_tokens = args.get("max_tokens") or args.get("max_completion_tokens")
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        rendered = await self.bridged_prompt(renderer, prompt, state, tools)
        if rendered is None:
            rendered = await asyncio.to_thread(renderer.render, prompt, tools=tools, add_generation_prompt=True)
        try:
            return await generate(client=self.client, renderer=renderer, messages=prompt, model=model,
                                  prompt_ids=list(rendered.token_ids), prompt_attribution=rendered,
                                  multi_modal_data=rendered.multi_modal_data, tools=tools, sampling_params=params,
                                  cache_salt=args.get("cache_salt") or params.pop("cache_salt", None),
                                  priority=args.get("priority") or params.pop("priority", None),
                                  extra_headers=headers or None)
        except renderers.OverlongPromptError as exc:
            raise OverlongPromptError(str(exc)) from exc
        except renderers.MalformedGenerateResponseError as exc:
            raise InvalidModelResponseError(f"generate response: {exc}") from exc

    def raise_from_native_response(self, response: Any) -> None:
        if not isinstance(response, Mapping):
            raise InvalidModelResponseError("model returned no generate response")
        if not (response.get("content") or response.get("tool_calls") or response.get("reasoning_content")):
            if response.get("finish_reason") != "length":
                raise EmptyModelResponseError("model returned neither content nor tool calls")

    def from_native_response(self, response: Any) -> Response:
        calls = [c for c in response.get("tool_calls") or [] if getattr(c, "name", None)]
        tool_calls = [ToolCall(id=c.id or f"call_{i}", name=c.name,
                               arguments=c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments or {}))
                      for i, c in enumerate(calls)] or None
        reason = response.get("finish_reason")
        finish = reason if reason in ("stop", "length", "tool_calls") else None
        prompt_ids = list(response.get("prompt_ids") or [])
        completion_ids = list(response.get("completion_ids") or [])
        tokens = ResponseTokens(prompt_ids=prompt_ids, prompt_mask=[0] * len(prompt_ids),
                                completion_ids=completion_ids, completion_mask=[1] * len(completion_ids),
                                completion_logprobs=list(response.get("completion_logprobs") or []))
        return Response(
            id=response.get("request_id") or "",
            created=0,
            model="",
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(completion_ids),
                        total_tokens=len(prompt_ids) + len(completion_ids)),
            message=ResponseMessage(content=response.get("content"), reasoning_content=response.get("reasoning_content"),
                                    finish_reason=finish, is_truncated=reason == "length", tool_calls=tool_calls,
                                    tokens=tokens),
        )
