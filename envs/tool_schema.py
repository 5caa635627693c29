"""Python function -> `Tool` (JSON schema from type hints and docstring), and a
tool's return value -> tool-message content."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from .types import Tool

_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_ARGS = {"args", "arguments", "parameters", "params"}
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {arg: description}) of a Google-style docstring: the summary is the
    text before the first section (Args:, Returns:, ...)."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for line in inspect.cleandoc(doc or "").splitlines():
        header = _SECTION.match(line)
        if header and not line.startswith((" ", "\t")):
            section, current, arg_indent = header.group(1).strip().lower(), None, None
            continue
        if section is None:
            summary.append(line)
        elif section in _ARGS and line.strip():
            indent = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = m.group(1)
                params[current] = m.group(3).strip()
            elif current:
                params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(summary).strip(), params


VALID_TOOL_CONTENT_PART_TYPES = frozenset({"text", "image_url"})


def is_valid_tool_content_parts(value: Any) -> bool:
    """True for a list of content parts (`{"type": "text" | "image_url", ...}`)."""
    return isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") in VALID_TOOL_CONTENT_PART_TYPES for p in value
    )


def tool_message_content(result: Any) -> str | list[dict[str, Any]]:
    """A tool's return value as tool-message content: a string, content parts kept
    as parts (text and images reach the model), anything else `str()`."""
    if isinstance(result, str) or is_valid_tool_content_parts(result):
        return result
    return str(result)


def _strict(schema: Any) -> Any:
    """The OpenAI strict form, recursively: every object closed
    (`additionalProperties: false`) with all its properties required; a `None`
    default dropped (the reference's `ensure_strict_json_schema`)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", False)
        out["required"] = list(out["properties"])
    if "default" in out and out["default"] is None:
        out.pop("default")
    return out


def convert_func_to_tool_def(func: Callable[..., Any], skip: list[str] | None = None) -> Tool:
    """A strict Tool for `func`, in the reference's schema: name, the docstring's
    summary, parameters as a pydantic model `<name>_args` (property titles,
    defaults, docstring `Args:` or `Annotated[..., Field(description=)]`
    descriptions), closed and with every property required.
    Arguments in `skip` (and self / *args / **kwargs) are left out."""
    from pydantic import Field, create_model

    skip_set = set(skip or ())
    sig = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:
        hints = {}
    description, param_docs = _doc_parts(getattr(func, "__doc__", "") or "")
    name = getattr(func, "__name__", type(func).__name__)
    fields: dict[str, Any] = {}
    for pname, p in sig.parameters.items():
        if pname in skip_set or pname == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, p.annotation)
        if annotation is inspect.Parameter.empty:
            annotation = Any
        default = ... if p.default is inspect.Parameter.empty else p.default
        if pname in param_docs:
            fields[pname] = (annotation, Field(default, description=param_docs[pname]))
        else:
            fields[pname] = (annotation, default)
    model = create_model(f"{name}_args", **fields)  # type: ignore[call-overload]
    return Tool(name=name, description=description, parameters=_strict(model.model_json_schema()), strict=True)
