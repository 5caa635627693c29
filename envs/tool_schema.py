"""Python function -> `Tool` (JSON schema from type hints and docstring)."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from .types import Tool

_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if in_args:
            if line.strip() and not line.startswith((" ", "\t")) and line.rstrip().endswith(":"):
                in_args = False  # next section (Returns:, Raises:)
                continue
            m = _ARG_LINE.match(line)
            if m and (line.startswith((" ", "\t")) or not line.startswith(" ")) and m.group(1).lstrip("*") and len(line) - len(line.lstrip()) <= 4:
                current = m.group(1).lstrip("*")
                params[current] = m.group(3).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
            continue
        if not any(_ARGS_HEADER.match(x) for x in [line]) and not re.match(r"^\s*(Returns?|Raises|Yields|Examples?)\s*:", line):
            summary.append(line)
        else:
            break
    text = "\n".join(summary).strip()
    return text, params


def _schema_for(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    from pydantic import TypeAdapter

    try:
        schema = TypeAdapter(annotation).json_schema()
    except Exception:
        return {}
    schema.pop("title", None)
    return schema


def convert_func_to_tool_def(func: Callable[..., Any], skip: list[str] | None = None) -> Tool:
    """A Tool for `func`: name, first docstring paragraph, parameters schema.
    Arguments in `skip` (and self / *args / **kwargs) are left out of the schema."""
    skip_set = set(skip or ())
    sig = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception:
        hints = {}
    description, param_docs = _doc_parts(getattr(func, "__doc__", "") or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if name in skip_set or name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _schema_for(hints.get(name, p.annotation))
        if "$defs" in schema:
            defs.update(schema.pop("$defs"))
        if name in param_docs:
            schema["description"] = param_docs[name]
        if p.default is not inspect.Parameter.empty:
            try:
                import json

                json.dumps(p.default)
                schema["default"] = p.default
            except (TypeError, ValueError):
                pass
        else:
            required.append(name)
        properties[name] = schema
    params: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if defs:
        params["$defs"] = defs
    name = getattr(func, "__name__", type(func).__name__)
    return Tool(name=name, description=description, parameters=params)
