"""Parsers: turn a model's completion into the answer a rubric scores.

`Parser` (text as-is, through `extract_fn`), `XMLParser` (tagged fields),
`ThinkParser` (text after `</think>`), `MaybeThinkParser` (strips an optional
think block).
"""

from __future__ import annotations

import logging
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
    if isinstance(content, list):  # content parts: the text ones, as the reference
        texts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else getattr(p, "text", None) for p in content]
        return " ".join(t for t in texts if isinstance(t, str)).strip()
    return str(content)


class Parser:
    """Base parser: returns the text as-is (after `extract_fn`)."""

    def __init__(self, extract_fn: Callable[[str], str] = _identity):
        self.logger = logging.getLogger(f"{__name__}.{type(self).__name__}")
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
    """For models that always emit `<think>...</think>` and whose server does not
    strip it: parses the text after `</think>`; without `</think>` the answer is
    empty (nothing is extracted from an unfinished thought), as the reference."""

    def parse(self, text: str) -> Any:
        text = text.split("</think>")[-1].strip() if "</think>" in text else ""
        return self.extract_fn(text)

    def get_format_reward_func(self) -> Callable[..., float]:
        def follows_think_format(completion: Messages, **kwargs: Any) -> float:
            msgs = self.get_assistant_messages(completion)
            if not msgs:
                return 0.0
            ok = 0
            for m in msgs:
                text = _content_text(m.get("content"))
                if (
                    text.strip().startswith("<think>")
                    and text.count("<think>") == 1
                    and text.count("</think>") == 1
                    and len(text.split("</think>")[-1]) > 0
                ):
                    ok += 1
            return ok / len(msgs)

        return follows_think_format


class MaybeThinkParser(Parser):
    """For models that may or may not think: drops a leading think block if present."""

    def parse(self, text: str) -> Any:
        return self.extract_fn(text.split("</think>")[-1].strip())


class XMLParser(Parser):
    """Extracts `<field>...</field>` values (a field needs its closing tag); a field
    may be a tuple of alternative tags, the first canonical (used by `format`).
    Behaviour, format string and format reward follow the reference."""

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
            if isinstance(f, str):
                alts: tuple[str, ...] = (f,)
            elif isinstance(f, tuple):
                if not f:
                    raise ValueError("Field tuple cannot be empty.")
                if not all(isinstance(a, str) for a in f):
                    raise TypeError("All alternatives in a tuple must be strings.")
                alts = f
            else:
                raise TypeError("Each field must be a string or a tuple of strings.")
            if alts[0] in seen:
                raise ValueError(f"Duplicate field name: {alts[0]}")
            seen.add(alts[0])
            self._fields.append((alts[0], alts))
        self.answer_field = answer_field
        self._patterns = {
            alt: re.compile(rf"<{re.escape(alt)}>\s*(.*?)\s*</{re.escape(alt)}>", re.DOTALL)
            for _, alts in self._fields
            for alt in alts
        }

    def get_fields(self) -> list[str]:
        return [canonical for canonical, _ in self._fields]

    def parse(self, text: str, strip: bool = True, last: bool = False) -> SimpleNamespace:
        """An object with one attribute per allowed tag (alternatives included),
        None when the tag is absent; `last` takes the last occurrence."""
        result: dict[str, str | None] = {}
        for _, alts in self._fields:
            for alt in alts:
                matches = list(self._patterns[alt].finditer(text))
                match = (matches[-1] if last else matches[0]) if matches else None
                result[alt] = (match.group(1).strip() if strip else match.group(1)) if match else None
        return SimpleNamespace(**result)

    def parse_answer(self, completion: Messages) -> str | None:
        """The answer field of the last assistant message that has one (the last
        occurrence in a string completion)."""
        if isinstance(completion, str):
            return getattr(self.parse(completion, last=True), self.answer_field, None)
        for msg in reversed(self.get_assistant_messages(completion)):
            value = getattr(self.parse(_content_text(msg.get("content"))), self.answer_field, None)
            if value is not None:
                return value
        return None

    def get_format_str(self) -> str:
        parts = []
        for canonical, alts in self._fields:
            tag = f"[ {' | '.join(alts)} ]" if len(alts) > 1 else canonical
            parts.append(f"<{tag}>\n...\n</{tag}>")
        return "\n".join(parts)

    def format(self, **kwargs: Any) -> str:
        """The fields as XML under their canonical tags; every field is required
        (a value may be given under any of its alternative names)."""
        out = []
        for canonical, alts in self._fields:
            key = canonical if canonical in kwargs else next((a for a in alts if a in kwargs), None)
            value = kwargs.get(key) if key is not None else None
            if value is None:
                raise ValueError(f"Missing value for field '{canonical}' (allowed: {list(alts)})")
            out.append(f"<{canonical}>\n{value}\n</{canonical}>")
        return "\n".join(out)

    def get_format_reward_func(self) -> Callable[..., float]:
        """Per assistant message: 0.4 x share of field sets present, + 0.2 each for
        well-formed spacing, starting with a first-set tag, ending with a last-set
        tag; averaged over messages."""

        def score(content: str) -> float:
            parsed, raw = self.parse(content), self.parse(content, strip=False)
            present: set[int] = set()
            has_any, spacing_ok = False, True
            for i, (_, alts) in enumerate(self._fields):
                for alt in alts:
                    if getattr(parsed, alt) is not None:
                        has_any = True
                        present.add(i)
                        if getattr(raw, alt) is None:
                            spacing_ok = False
                    elif f"<{alt}>" in content or f"</{alt}>" in content:
                        present.add(i)
            stripped = content.strip()
            total = 0.4 * len(present) / len(self._fields) if has_any else 0.0
            total += 0.2 if spacing_ok else 0.0
            total += 0.2 if any(stripped.startswith(f"<{a}>") for a in self._fields[0][1]) else 0.0
            total += 0.2 if any(stripped.endswith(f"</{a}>") for a in self._fields[-1][1]) else 0.0
            return total

        def format_reward_func(completion: Messages, **kwargs: Any) -> float:
            msgs = self.get_assistant_messages(completion)
            if not msgs:
                return 0.0
            return sum(score(_content_text(m.get("content"))) for m in msgs) / len(msgs)

        return format_reward_func
