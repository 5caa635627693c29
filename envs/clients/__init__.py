"""Model clients: one provider-neutral `Client` API over the official SDKs.

The SDK-backed classes are imported lazily (the SDKs take seconds to import)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import Client, ModelAuthError, TransientModelError
from .config import ClientConfig, EndpointClientConfig, resolve_api_key

if TYPE_CHECKING:
    from .anthropic_client import AnthropicMessagesClient
    from .openai_clients import OpenAIChatCompletionsClient, OpenAICompletionsClient

_LAZY = {
    "OpenAIChatCompletionsClient": ".openai_clients",
    "OpenAICompletionsClient": ".openai_clients",
    "AnthropicMessagesClient": ".anthropic_client",
    "OpenAIResponsesClient": ".openai_responses",
    "OpenAIChatCompletionsTokenClient": ".openai_token_client",
    "NeMoRLChatCompletionsClient": ".nemorl_client",
    "RendererClient": ".renderer_client",
}

CLIENT_TYPES = {
    "openai_chat_completions": "OpenAIChatCompletionsClient",
    "openai_completions": "OpenAICompletionsClient",
    "openai_responses": "OpenAIResponsesClient",
    "openai_chat_completions_token": "OpenAIChatCompletionsTokenClient",
    "nemorl_chat_completions": "NeMoRLChatCompletionsClient",
    "renderer": "RendererClient",
    "anthropic_messages": "AnthropicMessagesClient",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


def check_client_type(client_type: str) -> None:
    """ConfigError unless `client_type` names an implemented client."""
    from sandboxes.errors import ConfigError

    if client_type not in CLIENT_TYPES:
        raise ConfigError(f"unknown client type {client_type!r}; one of {', '.join(CLIENT_TYPES)}")


def client_module(client_type: str) -> str:
    """The module that defines `client_type`'s client (what a fork server preloads)."""
    check_client_type(client_type)
    return __name__ + _LAZY[CLIENT_TYPES[client_type]]


def client_class(client_type: str) -> type[Client]:
    check_client_type(client_type)
    return __getattr__(CLIENT_TYPES[client_type])


def make_client(obj: Any) -> Client:
    """A Client from a Client, a ClientConfig, or a raw AsyncOpenAI / AsyncAnthropic."""
    if isinstance(obj, Client):
        return obj
    if isinstance(obj, ClientConfig):
        return client_class(obj.client_type)(obj)
    module = type(obj).__module__
    if module.startswith("anthropic"):
        return __getattr__("AnthropicMessagesClient")(obj)
    return __getattr__("OpenAIChatCompletionsClient")(obj)


__all__ = [
    "AnthropicMessagesClient",
    "Client",
    "ClientConfig",
    "EndpointClientConfig",
    "ModelAuthError",
    "TransientModelError",
    "OpenAIChatCompletionsClient",
    "OpenAICompletionsClient",
    "OpenAIResponsesClient",
    "RendererClient",
    "client_class",
    "client_module",
    "make_client",
    "resolve_api_key",
]
