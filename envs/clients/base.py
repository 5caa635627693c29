"""The provider-neutral `Client`: wraps one SDK client and converts prompts,
tools and responses between vf types and the provider's native ones."""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from ..errors import Error, ModelError, OverlongPromptError
from ..types import Messages, Response, SamplingArgs, Tool
from .config import ClientConfig

ClientT = TypeVar("ClientT")


log = logging.getLogger("envs.clients")


class ModelAuthError(ModelError):
    """The endpoint refused the API key (401/403). Fatal for a run: retrying cannot help."""

    cause = "auth"


class TransientModelError(ModelError):
    """The model API failed in a way that may pass: no connection, a timeout, 408,
    429 or 5xx (after the SDK's own retries). Its rollout is retried under the env's
    retry policy, waiting at least `retry_after` seconds when the server said so;
    in results it is still a model error (kind "model"), never a task or infra one."""

    retryable = True

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None,
                 cause: str = "unknown") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.cause = cause
        """One of MODEL_ERROR_CAUSES: why the API failed, in words a user acts on."""


MODEL_ERROR_CAUSES = {
    "connection_refused": "connection refused (nothing listens there: is the model server running?)",
    "dns": "DNS lookup failed (check the host name in -b / the endpoints registry, or the network)",
    "timeout": "timed out",
    "connection": "connection failed",
    "rate_limit": "rate limited (429)",
    "server_error": "server error (5xx)",
    "auth": "API key refused (401/403)",
    "unknown": "failed",
}


def connection_cause(exc: BaseException) -> str:
    """Why a connection-level SDK error happened, read from its cause chain (the SDKs
    report even a refused connection as `APITimeoutError`): connection_refused, dns,
    timeout or connection."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    timed_out = False
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError) or getattr(cur, "errno", None) == errno.ECONNREFUSED:
            return "connection_refused"
        if isinstance(cur, socket.gaierror) or type(cur).__name__ == "ClientConnectorDNSError":
            return "dns"
        if isinstance(cur, (TimeoutError, socket.timeout)) or "Timeout" in type(cur).__name__:
            timed_out = True
        cur = cur.__cause__ or cur.__context__
    return "timeout" if timed_out else "connection"


def log_sdk_retries(sdk_logger: str) -> None:
    """Make the SDK's own retries visible: each "Retrying request ..." line of
    `sdk_logger` (logged at INFO by openai/anthropic) is repeated as a WARNING on
    `envs.clients`, so it reaches the console and the run log. Idempotent."""
    logger = logging.getLogger(sdk_logger)
    if any(isinstance(f, _SDKRetryForwarder) for f in logger.filters):
        return
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addFilter(_SDKRetryForwarder())


class _SDKRetryForwarder(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            msg = record.getMessage()
            if msg.startswith("Retrying request"):
                log.warning("model API client retry (its own, --client-max-retries): %s", msg)
            return False  # the SDK's other INFO lines stay quiet, as before
        return True


TRANSIENT_STATUSES = frozenset({408, 429})
"""HTTP statuses (besides every 5xx) that mean "try again later"."""


def is_transient_status(status: int | None) -> bool:
    return status is not None and (status in TRANSIENT_STATUSES or status >= 500)


def retry_after_seconds(headers: Any) -> float | None:
    """The server's requested wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        from email.utils import parsedate_to_datetime

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def classify_sdk_error(sdk: Any, exc: BaseException) -> BaseException:
    """The vf error for an exception of the `openai` or `anthropic` SDK (`sdk` is the
    module; both share the same exception names):

        401 / 403                       ModelAuthError (fatal for the run)
        connection error, timeout       TransientModelError (rollout retried)
        408 / 429 / 5xx                 TransientModelError, with the server's Retry-After
        400 "context length"/"too long" OverlongPromptError
        other 4xx, anything else        ModelError (not retried)
    """
    if isinstance(exc, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        return ModelAuthError(f"model endpoint refused the API key ({getattr(exc, 'status_code', '?')}): {exc}")
    if isinstance(exc, sdk.APIConnectionError):  # APITimeoutError included
        cause = connection_cause(exc)
        url = getattr(getattr(exc, "request", None), "url", None)
        where = f" at {url}" if url else ""
        return TransientModelError(f"model endpoint unreachable{where}: {MODEL_ERROR_CAUSES[cause]} "
                                   f"({_innermost(exc)})", cause=cause)
    status = getattr(exc, "status_code", None) if isinstance(exc, sdk.APIStatusError) else None
    if is_transient_status(status):
        response = getattr(exc, "response", None)
        cause = "rate_limit" if status == 429 else "server_error" if status and status >= 500 else "timeout"
        return TransientModelError(f"model endpoint answered {status} ({MODEL_ERROR_CAUSES[cause]}): {exc}", status=status,
                                   retry_after=retry_after_seconds(getattr(response, "headers", None)), cause=cause)
    if isinstance(exc, sdk.BadRequestError):
        text = str(exc).lower()
        if "context length" in text or "maximum context" in text or "too long" in text:
            return OverlongPromptError(str(exc))
    return ModelError(f"{type(exc).__name__}: {exc}")


def _innermost(exc: BaseException) -> str:
    """The deepest exception of the chain as "Type: message" (the real cause)."""
    seen: set[int] = set()
    cur, last = exc, exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        last = cur
        cur = cur.__cause__ or cur.__context__
    return f"{type(last).__name__}: {last}"


class Client(ABC, Generic[ClientT]):
    """Base of every model client. `get_response` is the one public call."""

    config: ClientConfig | None = None  # set by __init__; a subclass that skips it still has one
    _client: Any = None

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

    def classify_error(self, exc: BaseException) -> BaseException:
        """The vf error an SDK exception becomes (raised `from exc`). Not abstract, as in
        the reference: a custom client implementing only the reference's abstract methods
        gets ModelError; the built-in clients map auth / transient / overlong errors
        (`classify_sdk_error`)."""
        return ModelError(f"{type(exc).__name__}: {exc}")

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
            err = self.classify_error(exc)
            if isinstance(err, ModelAuthError) and self.config is not None:
                var = self.config.api_key_var
                err = ModelAuthError(f"{err} [endpoint {self.config.api_base_url}; key read from ${var}"
                                     f"{'' if os.environ.get(var) else ' (not set)'}; choose another with -k]")
            raise err from exc
        self.raise_from_native_response(native)
        return self.from_native_response(native)


def now_int() -> int:
    return int(time.time())
