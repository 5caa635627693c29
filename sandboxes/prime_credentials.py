"""Prime Intellect credentials, read the way the `prime` CLI leaves them, for
both the model clients (envs.clients) and the Prime sandbox backend:

* API key: `$PRIME_API_KEY` > `api_key` of `~/.prime/config.json` > not set;
* team:    `$PRIME_TEAM_ID` > `team_id` of `~/.prime/config.json` > not set.

So a machine where `prime login` ran (and a team was picked) needs no
variables."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

API_KEY_VAR = "PRIME_API_KEY"
TEAM_ID_VAR = "PRIME_TEAM_ID"
TEAM_HEADER = "X-Prime-Team-ID"


def config_file() -> dict[str, Any]:
    """`~/.prime/config.json` as a dict ({} when missing or unreadable)."""
    try:
        data = json.loads((Path.home() / ".prime" / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def api_key() -> str | None:
    return os.environ.get(API_KEY_VAR) or str(config_file().get("api_key") or "") or None


def team_id() -> str | None:
    return os.environ.get(TEAM_ID_VAR) or str(config_file().get("team_id") or "") or None
