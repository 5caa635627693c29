"""Which contract an OpenEnv project speaks: `gym` (its own action type through
reset/step) or `mcp` (`CallToolAction`s: list_tools / call_tool).

Decided from what the server really serves, never from its source text:
`contract_from_schema(schema)` reads the running server's `/schema` (an action
with `tool_name` + `arguments`, or the `list_tools`/`call_tool` type values,
means mcp). `openenv build` records it in the manifest (`probe.py`); every
rollout checks it again (`check_contract` raises `ContractMismatch` naming
both sides). `app_source_path` only checks that the app module exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError

from .manifest import Contract

_MCP_TYPE_VALUES = {"list_tools", "call_tool"}


class ContractMismatch(ConfigError):
    """The manifest's contract and the running server's schema disagree."""


def app_source_path(project: str | Path, app: str) -> Path:
    """`server.app:app` → PROJECT/server/app.py (or server/app/__init__.py)."""
    module = app.partition(":")[0]
    base = Path(project).joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    raise ConfigError(f"app module {module!r} not found under {project} (looked for {base}.py)")


def _values(schema: Any):
    """Every `const` / `enum` / `default` string in a JSON schema, recursively."""
    if isinstance(schema, dict):
        for key, val in schema.items():
            if key in ("const", "default") and isinstance(val, str):
                yield val
            elif key == "enum" and isinstance(val, list):
                yield from (v for v in val if isinstance(v, str))
            else:
                yield from _values(val)
    elif isinstance(schema, list):
        for item in schema:
            yield from _values(item)


def contract_from_schema(schema: dict[str, Any]) -> Contract:
    """The contract a `/schema` response implies (its `action` part, or the schema itself)."""
    action = schema.get("action", schema) if isinstance(schema, dict) else {}
    props = action.get("properties", {}) if isinstance(action, dict) else {}
    if "tool_name" in props and "arguments" in props:
        return "mcp"
    if _MCP_TYPE_VALUES & set(_values(action)):
        return "mcp"
    return "gym"


def check_contract(expected: Contract, schema: dict[str, Any], *, where: str = "") -> Contract:
    """Raise ContractMismatch unless the server's schema implies `expected`."""
    actual = contract_from_schema(schema)
    if actual != expected:
        props = sorted((schema.get("action") or {}).get("properties", {}))
        raise ContractMismatch(
            f"contract mismatch{' for ' + where if where else ''}: the manifest (.build.json) says "
            f"{expected!r} but the running server's /schema says {actual!r} (action fields: {props}); "
            f"rebuild with `vf-sandbox openenv build`"
        )
    return actual
