"""Client configuration: which API, where, with which key (by variable name).

The models live in envs.types (the reference exports them from its types
module); this module resolves keys."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import MissingKeyError
from .. import types as _types
from ..types import ClientConfig, EndpointClientConfig

DEFAULT_BASE_URL, DEFAULT_KEY_VAR = _types.DEFAULT_BASE_URL, _types.DEFAULT_KEY_VAR
__all__ = ["ClientConfig", "EndpointClientConfig", "resolve_api_key"]


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
