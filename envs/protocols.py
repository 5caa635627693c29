"""The requests of the other model APIs read as OpenAI chat messages: an
Anthropic Messages body (`system`, tool_use / tool_result blocks) and an
OpenAI Responses body (`instructions`, function_call / function_call_output
items), and their tool lists. Shared by the v1 interception endpoint (which
serves those APIs to programs) and the local model server."""

from __future__ import annotations

import json
from typing import Any


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if "text" in block:
                    parts.append(str(block["text"]))
                elif block.get("type") == "tool_result":
                    parts.append(text_of(block.get("content")))
            else:
                parts.append(str(block))
        return "".join(parts)
    return str(content)


def anthropic_to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": text_of(system)})
    for msg in body.get("messages") or []:
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        texts: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        for block in content or []:
            btype = block.get("type")
            if btype == "text":
                texts.append(block.get("text", ""))
            elif btype == "tool_use":
                tool_calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})},
                    }
                )
            elif btype == "tool_result":
                out.append(
                    {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text_of(block.get("content"))}
                )
        if texts or tool_calls:
            entry: dict[str, Any] = {"role": role, "content": "".join(texts)}
            if tool_calls:
                entry["tool_calls"] = tool_calls
            out.append(entry)
    return out


def responses_to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses API `instructions` + `input` items, as chat messages."""
    out: list[dict[str, Any]] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1].get("role") == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text_of(item.get("output"))})
        else:
            out.append({"role": item.get("role", "user"), "content": text_of(item.get("content"))})
    return out


def tools_of(body: dict[str, Any], api: str) -> list[dict[str, Any]]:
    tools = []
    for tool in body.get("tools") or []:
        if api == "anthropic":
            tools.append(
                {"name": tool.get("name"), "description": tool.get("description", ""), "parameters": tool.get("input_schema", {})}
            )
        else:
            fn = tool.get("function", tool)
            tools.append(
                {"name": fn.get("name"), "description": fn.get("description", ""), "parameters": fn.get("parameters", {})}
            )
    return tools
