"""Client configuration: which API, where, with which key (by variable name).

The models live in envs.types (the reference exports them from its types
module); this module resolves keys."""

from __future__ import annotations

import os

from sandboxes import prime_credentials

from ..errors import MissingKeyError
from .. import types as _types
from ..types import ClientConfig, EndpointClientConfig

DEFAULT_BASE_URL, DEFAULT_KEY_VAR = _types.DEFAULT_BASE_URL, _types.DEFAULT_KEY_VAR
__all__ = ["ClientConfig", "EndpointClientConfig", "client_headers", "resolve_api_key"]


def resolve_api_key(var: str) -> str:
    """The API key from environment variable `var`.

    PRIME_API_KEY (the default) falls back to ~/.prime/config.json, then
    "EMPTY"; any other variable must be set (MissingKeyError names it)."""
    value = os.environ.get(var)
    if value:
        return value
    if var == DEFAULT_KEY_VAR:
        return prime_credentials.api_key() or "EMPTY"
    if var in ("", "EMPTY"):
        return "EMPTY"
    raise MissingKeyError([var])


def client_headers(config: ClientConfig) -> dict[str, str] | None:
    """The default headers of a client: `extra_headers`, plus the Prime team
    (`X-Prime-Team-ID`: $PRIME_TEAM_ID > ~/.prime/config.json) when the key is
    PRIME_API_KEY, as the reference does."""
    headers = dict(config.extra_headers or {})
    if config.api_key_var == DEFAULT_KEY_VAR:
        team = prime_credentials.team_id()
        if team:
            headers[prime_credentials.TEAM_HEADER] = team
    return headers or None
