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
}

CLIENT_TYPES = {
    "openai_chat_completions": "OpenAIChatCompletionsClient",
    "openai_chat_completions_token": "OpenAIChatCompletionsClient",
    "openai_completions": "OpenAICompletionsClient",
    "anthropic_messages": "AnthropicMessagesClient",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


def client_module(client_type: str) -> str:
    """The module that defines `client_type`'s client (what a fork server preloads)."""
    try:
        return __name__ + _LAZY[CLIENT_TYPES[client_type]]
    except KeyError:
        raise ValueError(f"unknown client type {client_type!r}; one of {sorted(CLIENT_TYPES)}") from None


def client_class(client_type: str) -> type[Client]:
    try:
        return __getattr__(CLIENT_TYPES[client_type])
    except KeyError:
        raise ValueError(f"unknown client type {client_type!r}; one of {sorted(CLIENT_TYPES)}") from None


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
    "client_class",
    "client_module",
    "make_client",
    "resolve_api_key",
]
