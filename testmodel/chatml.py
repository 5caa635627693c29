"""Read a ChatML prompt (the Qwen3 chat template's text) back into chat messages and tools.

The local model server's token-in generate route gets only token ids; it decodes
them and parses the text with this to hand its scripted policy the conversation
in OpenAI chat form: `<|im_start|>{role}\\n{body}<|im_end|>` turns, the tools
as the JSON lines of the system turn's `<tools>` block, an assistant's
`<think>` reasoning and `<tool_call>` JSON calls, and a user turn made only of
`<tool_response>` blocks as tool results (ids taken from the calls they
answer, in order). The trailing open assistant turn (the generation prompt) is
left out.
"""

from __future__ import annotations

import json
import re
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_THINK = re.compile(r"^<think>\n?(.*?)\n?</think>\n*", re.S)
_CALL = re.compile(r"<tool_call>\n?(.*?)\n?</tool_call>", re.S)
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


class ChatMLError(ValueError):
    """The text is not a ChatML conversation."""


def parse_prompt(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a rendered ChatML prompt; the tools as rendered (OpenAI
    function envelopes)."""
    if not text.startswith(IM_START):
        raise ChatMLError(f"a ChatML prompt starts with {IM_START}: {text[:40]!r}")
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    pending_ids: list[str] = []
    for turn in text.split(IM_START)[1:]:
        if IM_END not in turn:  # the generation prompt
            continue
        head, _, body = turn.split(IM_END, 1)[0].partition("\n")
        role = head.strip()
        if role == "system":
            found = _TOOLS.search(body)
            if found:
                tools += [json.loads(line) for line in found.group(1).splitlines()]
                body = body.split("# Tools", 1)[0].rstrip("\n")
            if body:
                messages.append({"role": "system", "content": body})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant"}
            think = _THINK.match(body)
            if think:
                if think.group(1).strip():
                    msg["reasoning_content"] = think.group(1).strip()
                body = body[think.end():]
            calls = []
            for i, raw in enumerate(_CALL.findall(body)):
                call = json.loads(raw)
                calls.append({"id": f"call_{len(messages)}_{i}", "type": "function",
                              "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}})
            msg["content"] = _CALL.sub("", body).strip() or None
            if calls:
                msg["tool_calls"] = calls
                pending_ids = [c["id"] for c in calls]
            messages.append(msg)
        elif role == "user" and body.startswith("<tool_response>"):
            for result in _RESPONSE.findall(body):
                call_id = pending_ids.pop(0) if pending_ids else None
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            messages.append({"role": role, "content": body})
    return messages, tools
