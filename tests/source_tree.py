"""Parsing the project's own source in tests (layering, cancellation hygiene).

CPython 3.11.7's AST validator keeps its recursion counter in shared state:
an `ast.parse` racing a compile in another thread (a background import in a
daemon thread left by an earlier test) can fail with "AST constructor
recursion depth mismatch" (a CPython bug fixed in later releases). The
source is fine, so the parse is retried."""

from __future__ import annotations

import ast
import time
from pathlib import Path


def parse_file(path: Path, filename: str | None = None, attempts: int = 5) -> ast.Module:
    text = path.read_text(encoding="utf-8")
    for attempt in range(attempts):
        try:
            return ast.parse(text, filename or str(path))
        except SystemError as exc:  # only the race above; a SyntaxError is never retried
            if "recursion depth mismatch" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")
