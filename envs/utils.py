"""Small helpers environments use: answer extraction and key checks."""

from __future__ import annotations

import os

from .errors import MissingKeyError


def extract_boxed_answer(text: str, strict: bool = False) -> str:
    """The content of the last `\\boxed{...}` (balanced braces). Without one:
    `text` itself, or "" when `strict`."""
    idx = text.rfind("\\boxed{")
    if idx < 0:
        return "" if strict else text
    i = idx + len("\\boxed{")
    depth = 1
    start = i
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return "" if strict else text


def extract_hash_answer(text: str) -> str | None:
    """The text after `####` (GSM8K format), stripped; None if absent."""
    if "####" not in text:
        return None
    return text.split("####", 1)[1].strip()


def ensure_keys(keys: list[str]) -> None:
    """Raise MissingKeyError naming every variable of `keys` that is unset or empty."""
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        raise MissingKeyError(missing)
