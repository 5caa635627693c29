"""Client configuration: which API, where, with which key (by variable name)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..errors import MissingKeyError
from ..types import ClientType

DEFAULT_KEY_VAR = "PRIME_API_KEY"
DEFAULT_BASE_URL = "https://api.pinference.ai/api/v1"


class EndpointClientConfig(BaseModel):
    """One endpoint replica inside ClientConfig.endpoint_configs."""

    client_idx: int = 0
    api_key_var: str = DEFAULT_KEY_VAR
    api_base_url: str = DEFAULT_BASE_URL
    timeout: float = 3600.0
    connect_timeout: float = 5.0
    max_connections: int = 28000
    max_keepalive_connections: int = 28000
    max_retries: int = 10
    extra_headers: dict[str, str] = Field(default_factory=dict)


class ClientConfig(BaseModel):
    """How to build a Client. With `endpoint_configs`, requests go round-robin
    over the replicas (one group stays on one replica)."""

    client_idx: int = 0
    client_type: ClientType = "openai_chat_completions"
    preserve_all_thinking: bool = False
    preserve_thinking_between_tool_calls: bool = False
    api_key_var: str = DEFAULT_KEY_VAR
    api_base_url: str = DEFAULT_BASE_URL
    endpoint_configs: list[EndpointClientConfig] = Field(default_factory=list)
    timeout: float = 3600.0
    connect_timeout: float = 5.0
    max_connections: int = 28000
    max_keepalive_connections: int = 28000
    max_retries: int = 10
    extra_headers: dict[str, str] = Field(default_factory=dict)
    extra_headers_from_state: dict[str, str] = Field(default_factory=dict)

    def replicas(self) -> list["ClientConfig"]:
        """One single-endpoint ClientConfig per replica (or [self])."""
        if not self.endpoint_configs:
            return [self]
        out = []
        for i, ep in enumerate(self.endpoint_configs):
            data = self.model_dump(exclude={"endpoint_configs"})
            data.update(ep.model_dump())
            data["client_idx"] = i
            data["extra_headers"] = {**self.extra_headers, **ep.extra_headers}
            out.append(ClientConfig(**data))
        return out

    def base_urls(self) -> str:
        return ",".join(r.api_base_url for r in self.replicas())


def resolve_api_key(var: str) -> str:
    """The API key from environment variable `var`.

    PRIME_API_KEY (the default) falls back to ~/.prime/config.json, then
    "EMPTY"; any other variable must be set (MissingKeyError names it)."""
    value = os.environ.get(var)
    if value:
        return value
    if var == DEFAULT_KEY_VAR:
        cfg = Path.home() / ".prime" / "config.json"
        try:
            data: dict[str, Any] = json.loads(cfg.read_text())
            if data.get("api_key"):
                return str(data["api_key"])
        except (OSError, ValueError):
            pass
        return "EMPTY"
    if var in ("", "EMPTY"):
        return "EMPTY"
    raise MissingKeyError([var])
