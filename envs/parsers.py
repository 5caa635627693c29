"""Parsers: turn a model's completion into the answer a rubric scores.

`Parser` (text as-is, through `extract_fn`), `XMLParser` (tagged fields),
`ThinkParser` (text after `</think>`), `MaybeThinkParser` (strips an optional
think block).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from .types import Messages


def _identity(x: str) -> str:
    return x


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


class Parser:
    """Base parser: returns the text as-is (after `extract_fn`)."""

    def __init__(self, extract_fn: Callable[[str], str] = _identity):
        self.extract_fn = extract_fn

    def parse(self, text: str) -> Any:
        return self.extract_fn(text)

    def get_assistant_messages(self, completion: Messages) -> list[dict[str, Any]]:
        if isinstance(completion, str):
            return [{"role": "assistant", "content": completion}]
        return [m for m in completion if m.get("role") == "assistant"]

    def get_user_messages(self, completion: Messages) -> list[dict[str, Any]]:
        return [m for m in completion if isinstance(m, dict) and m.get("role") == "user"]

    def get_tool_messages(self, completion: Messages) -> list[dict[str, Any]]:
        return [m for m in completion if isinstance(m, dict) and m.get("role") == "tool"]

    def last_assistant_text(self, completion: Messages) -> str | None:
        if isinstance(completion, str):
            return completion
        for msg in reversed(completion):
            if msg.get("role") == "assistant":
                return _content_text(msg.get("content"))
        return None

    def parse_answer(self, completion: Messages) -> str | None:
        text = self.last_assistant_text(completion)
        if text is None:
            return None
        return self.parse(text)

    def get_format_reward_func(self) -> Callable[..., float]:
        def format_reward_func(completion: Messages, **kwargs: Any) -> float:
            return 1.0

        return format_reward_func


class ThinkParser(Parser):
    """For models that always emit `<think>...</think>`: parses the text after it
    (empty when the closing tag is missing)."""

    def parse(self, text: str) -> Any:
        if "</think>" in text:
            text = text.split("</think>")[-1]
        elif "<think>" in text:
            return ""
        return self.extract_fn(text.strip())

    def get_format_reward_func(self) -> Callable[..., float]:
        def follows_think_format(completion: Messages, **kwargs: Any) -> float:
            msgs = Parser().get_assistant_messages(completion)
            if not msgs:
                return 0.0
            ok = 0
            for m in msgs:
                text = _content_text(m.get("content")).strip()
                if text.startswith("<think>") and text.count("</think>") == 1 and text.split("</think>")[-1].strip():
                    ok += 1
            return ok / len(msgs)

        return follows_think_format


class MaybeThinkParser(Parser):
    """For models that may or may not think: drops a leading think block if present."""

    def parse(self, text: str) -> Any:
        if "</think>" in text:
            text = text.split("</think>")[-1]
        return self.extract_fn(text.strip())


class XMLParser(Parser):
    """Extracts `<field>...</field>` values; a field may be a tuple of alternative tags
    (the first is canonical)."""

    def __init__(
        self,
        fields: list[str | tuple[str, ...]],
        answer_field: str = "answer",
        extract_fn: Callable[[str], str] = _identity,
    ):
        super().__init__(extract_fn)
        self._fields: list[tuple[str, tuple[str, ...]]] = []
        seen: set[str] = set()
        for f in fields:
            alts = (f,) if isinstance(f, str) else tuple(f)
            if not alts:
                raise ValueError("XMLParser: empty field alternatives")
            if alts[0] in seen:
                raise ValueError(f"XMLParser: duplicate field {alts[0]!r}")
            seen.add(alts[0])
            self._fields.append((alts[0], alts))
        self.answer_field = answer_field
        self._patterns = {
            alt: re.compile(rf"<{re.escape(alt)}>\s*(.*?)\s*(?:</{re.escape(alt)}>|$)", re.DOTALL)
            for _, alts in self._fields
            for alt in alts
        }

    def get_fields(self) -> list[str]:
        return [canonical for canonical, _ in self._fields]

    def parse(self, text: str, strip: bool = True, last: bool = False) -> SimpleNamespace:
        result: dict[str, str | None] = {}
        for canonical, alts in self._fields:
            for alt in alts:
                matches = self._patterns[alt].findall(text)
                value = (matches[-1] if last else matches[0]) if matches else None
                if value is not None and strip:
                    value = value.strip()
                result[alt] = value
        return SimpleNamespace(**result)

    def parse_answer(self, completion: Messages) -> str | None:
        texts = (
            [completion]
            if isinstance(completion, str)
            else [_content_text(m.get("content")) for m in self.get_assistant_messages(completion)]
        )
        for text in reversed(texts):
            parsed = self.parse(text, last=True)
            value = getattr(parsed, self.answer_field, None)
            if value is not None:
                return self.extract_fn(value)
        return None

    def get_format_str(self) -> str:
        lines = []
        for canonical, alts in self._fields:
            tag = canonical if len(alts) == 1 else " | ".join(alts)
            lines.append(f"<{tag}>\n...\n</{tag}>")
        return "Respond in the following format:\n" + "\n".join(lines)

    def format(self, **kwargs: Any) -> str:
        out = []
        for canonical, alts in self._fields:
            for alt in alts:
                if alt in kwargs and kwargs[alt] is not None:
                    out.append(f"<{alt}>\n{kwargs[alt]}\n</{alt}>")
                    break
        return "\n".join(out)

    def get_format_reward_func(self) -> Callable[..., float]:
        def format_reward_func(completion: Messages, **kwargs: Any) -> float:
            msgs = self.get_assistant_messages(completion)
            if not msgs:
                return 0.0
            scores = []
            for m in msgs:
                parsed = self.parse(_content_text(m.get("content")))
                present = sum(
                    1 for canonical, alts in self._fields if any(getattr(parsed, a, None) is not None for a in alts)
                )
                scores.append(present / len(self._fields))
            return sum(scores) / len(scores)

        return format_reward_func
