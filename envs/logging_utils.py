"""Logging helpers with the reference library's names."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

LOGGER = "envs"
RUN_LOG_ONLY = {"run_log_only": True}
"""`extra=` for records meant for the run's log file only (a full traceback, an
error the CLI prints itself): console handlers drop them with `for_console`."""


def for_console(record: logging.LogRecord) -> bool:
    """Filter of console handlers: False for records logged with `extra=RUN_LOG_ONLY`."""
    return not getattr(record, "run_log_only", False)


def setup_logging(level: str | int | None = None, stream: Any = None) -> None:
    """Log `envs.*` to stderr at `level` (default $VF_LOG_LEVEL or INFO)."""
    level = level or os.environ.get("VF_LOG_LEVEL", "INFO")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level if isinstance(level, int) else str(level).upper())
    if not any(getattr(h, "_vf", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._vf = True  # type: ignore[attr-defined]
        handler.addFilter(for_console)
        logger.addHandler(handler)


@contextlib.contextmanager
def log_level(level: str | int) -> Iterator[None]:
    logger = logging.getLogger(LOGGER)
    old = logger.level
    logger.setLevel(level if isinstance(level, int) else str(level).upper())
    try:
        yield
    finally:
        logger.setLevel(old)


def quiet_verifiers() -> contextlib.AbstractContextManager[None]:
    return log_level("WARNING")


def print_prompt_completions_sample(outputs: Any, n: int = 3) -> None:
    """Print a few rollouts (prompt, completion, reward) with rich."""
    from rich.console import Console
    from rich.table import Table

    rows = outputs["outputs"] if isinstance(outputs, dict) and "outputs" in outputs else outputs
    table = Table(show_lines=True)
    for col in ("prompt", "completion", "reward"):
        table.add_column(col)
    for row in list(rows)[:n]:
        table.add_row(_short(row.get("prompt")), _short(row.get("completion")), f"{row.get('reward', 0):.3f}")
    Console().print(table)


def _short(messages: Any, limit: int = 400) -> str:
    if isinstance(messages, list):
        text = "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages if isinstance(m, dict))
    else:
        text = str(messages or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"
