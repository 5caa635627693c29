"""The provider-neutral `Client`: wraps one SDK client and converts prompts,
tools and responses between vf types and the provider's native ones."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from ..errors import Error, ModelError
from ..types import Messages, Response, SamplingArgs, Tool
from .config import ClientConfig

ClientT = TypeVar("ClientT")


class ModelAuthError(ModelError):
    """The endpoint refused the API key (401/403). Fatal for a run: retrying cannot help."""


class Client(ABC, Generic[ClientT]):
    """Base of every model client. `get_response` is the one public call."""

    def __init__(self, client_or_config: ClientT | ClientConfig) -> None:
        if isinstance(client_or_config, ClientConfig):
            self.config: ClientConfig | None = client_or_config
            self._client = self.setup_client(client_or_config)
        else:
            self.config = None
            self._client = client_or_config

    @property
    def client(self) -> ClientT:
        return self._client

    @property
    def base_url(self) -> str:
        return str(getattr(self._client, "base_url", "") or (self.config.api_base_url if self.config else ""))

    # ---- subclass contract
    @abstractmethod
    def setup_client(self, config: ClientConfig) -> ClientT: ...

    @abstractmethod
    def to_native_prompt(self, messages: Messages) -> tuple[Any, dict[str, Any]]: ...

    @abstractmethod
    def to_native_tool(self, tool: Tool) -> Any: ...

    @abstractmethod
    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: SamplingArgs, tools: list[Any] | None, **kwargs: Any
    ) -> Any: ...

    @abstractmethod
    def raise_from_native_response(self, response: Any) -> None: ...

    @abstractmethod
    def from_native_response(self, response: Any) -> Response: ...

    @abstractmethod
    def classify_error(self, exc: BaseException) -> BaseException:
        """Map an SDK exception to ModelAuthError / ModelError (with `from exc`)."""

    async def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            result = close()
            if hasattr(result, "__await__"):
                await result

    # ---- public
    async def get_response(
        self,
        prompt: Messages,
        model: str,
        sampling_args: SamplingArgs | None = None,
        tools: list[Tool] | None = None,
        **kwargs: Any,
    ) -> Response:
        native_prompt, extra = self.to_native_prompt(prompt)
        native_tools = [self.to_native_tool(t) for t in tools] if tools else None
        try:
            native = await self.get_native_response(
                native_prompt, model, dict(sampling_args or {}), native_tools, **extra, **kwargs
            )
        except Error:
            raise
        except Exception as exc:
            raise self.classify_error(exc) from exc
        self.raise_from_native_response(native)
        return self.from_native_response(native)


def now_int() -> int:
    return int(time.time())
