"""Model output → OpenEnv actions, and OpenEnv tools / results → model-facing form.

* gym: `parse_action(text, action_schema)` takes the assistant's JSON object
  (code fences stripped); when the schema has exactly one required string
  field, text that is not such an object becomes that field.
* mcp: `tool_defs(tools)` turns `list_tools` entries into `Tool`s for the
  model; `tool_result_text(observation)` renders a `CallToolObservation`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sandboxes.errors import Error

from ..types import Tool

_FENCE = re.compile(r"^\s*```[\w+-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_INNER_FENCE = re.compile(r"```[\w+-]*\s*\n(.*?)\n```", re.DOTALL)
_IGNORED_FIELDS = {"metadata"}


class ActionParseError(Error):
    """The assistant's message is not a valid action (the model is told and may retry)."""


def strip_fences(text: str) -> str:
    m = _FENCE.match(text)
    if m:
        return m.group(1).strip()
    m = _INNER_FENCE.search(text)
    return m.group(1).strip() if m else text.strip()


def single_string_field(action_schema: dict[str, Any]) -> str | None:
    """The field name when the schema has exactly one required field and it is a string."""
    required = [f for f in action_schema.get("required", []) if f not in _IGNORED_FIELDS]
    if len(required) != 1:
        return None
    prop = (action_schema.get("properties") or {}).get(required[0], {})
    types = prop.get("type")
    if types == "string" or (isinstance(types, list) and "string" in types):
        return required[0]
    if any(isinstance(alt, dict) and alt.get("type") == "string" for alt in prop.get("anyOf", [])):
        return required[0]
    return None


def parse_action(text: str | None, action_schema: dict[str, Any]) -> dict[str, Any]:
    """The action dict for `text`. Raises ActionParseError when it cannot be one."""
    text = text or ""
    body = strip_fences(text)
    field = single_string_field(action_schema)
    parsed: Any = None
    try:
        parsed = json.loads(body)
    except ValueError:
        pass
    if isinstance(parsed, dict) and (field is None or field in parsed):
        return parsed
    if field is not None:
        return {field: body}
    props = sorted(p for p in (action_schema.get("properties") or {}) if p not in _IGNORED_FIELDS)
    raise ActionParseError(
        f"could not read an action from the reply: answer with one JSON object with the fields {props}"
    )


def tool_defs(tools: list[dict[str, Any]]) -> list[Tool]:
    out = []
    for t in tools:
        params = t.get("input_schema") or t.get("inputSchema") or {"type": "object", "properties": {}}
        out.append(Tool(name=t["name"], description=t.get("description") or "", parameters=params))
    return out


def tool_result_text(observation: dict[str, Any]) -> str:
    """Text of a CallToolObservation: its error, else its content blocks / data."""
    error = observation.get("error")
    if error:
        if isinstance(error, dict):
            return f"error ({error.get('error_type', 'error')}): {error.get('message', '')}"
        return f"error: {error}"
    result = observation.get("result")
    if isinstance(result, dict):
        blocks = result.get("content")
        if isinstance(blocks, list):
            texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
            if texts:
                return "\n".join(texts)
        for key in ("data", "structured_content"):
            if result.get(key) is not None:
                val = result[key]
                return val if isinstance(val, str) else json.dumps(val)
    if isinstance(result, str):
        return result
    return json.dumps(result)
