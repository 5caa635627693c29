"""Logging helpers with the reference library's names."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from sandboxes import settings

LOGGER = "envs"
RUN_LOG_ONLY = {"run_log_only": True}
"""`extra=` for records meant for the run's log file only (a full traceback, an
error the CLI prints itself): console handlers drop them with `for_console`."""


def for_console(record: logging.LogRecord) -> bool:
    """Filter of console handlers: False for records logged with `extra=RUN_LOG_ONLY`."""
    return not getattr(record, "run_log_only", False)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (timestamp, level, name, message, module, function, line)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "level": record.levelname,
            "name": record.name,
            "message": record.getMessage(),
            "module": record.module,
            "function": record.funcName,
            "line": record.lineno,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


_UNSET: Any = object()


def setup_logging(
    level: str | int | None = _UNSET,
    log_format: str | None = None,
    date_format: str | None = None,
    log_file: str | None = None,
    console_logging: bool = True,
    file_logging: bool = False,
    json_logging: bool = False,
    stream: Any = None,
) -> None:
    """Configure the package logger (`envs`), as the reference's `setup_logging`:
    its handlers are replaced (calling twice does not duplicate lines), it stops
    propagating to the root logger, `level=None` silences it. Level defaults to
    the running settings' $VF_LOG_LEVEL (`sandboxes.settings.current()`) or INFO. `json_logging` emits one JSON object per line and also
    sets up the root logger (so an env's own `logging.getLogger(__name__)` is JSON
    too). `file_logging` needs `log_file`."""
    if level is _UNSET:
        level = settings.current().log_level or "INFO"
    if file_logging and log_file is None:
        raise ValueError("log_file must be specified when file_logging is True")
    formatter = _formatter(json_logging, log_format, date_format)
    logger = logging.getLogger(LOGGER)
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.propagate = False
    if level is None:
        return
    lvl = _level_number(level)
    logger.setLevel(lvl)
    handlers: list[logging.Handler] = []
    if console_logging:
        console = logging.StreamHandler(stream or sys.stderr)
        console.addFilter(for_console)  # records for the run's log file only stay off the console
        handlers.append(console)
    if file_logging:
        handlers.append(logging.FileHandler(str(log_file), mode="a", encoding="utf-8"))
    for h in handlers:
        h.setFormatter(formatter)
        h.setLevel(lvl)
        logger.addHandler(h)
    if json_logging:
        _log_root_as_json(formatter, lvl, stream)


def _formatter(json_logging: bool, log_format: str | None, date_format: str | None) -> logging.Formatter:
    """A JsonFormatter, or a text formatter with the given (or the reference's default) formats."""
    if json_logging:
        return JsonFormatter()
    return logging.Formatter(log_format or "%(asctime)s - %(name)s - %(levelname)s - %(message)s",
                             date_format or "%Y-%m-%d %H:%M:%S")


def _level_number(level: str | int) -> int:
    """The numeric level of `level` (an int, or a level name in any case); ValueError for an unknown name."""
    lvl = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level {level!r}")
    return lvl


def _log_root_as_json(formatter: logging.Formatter, lvl: int, stream: Any) -> None:
    """Give the root logger one JSON console handler at `lvl` (replacing an earlier one) and quiet httpx/httpcore."""
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not isinstance(h.formatter, JsonFormatter)]
    root.setLevel(lvl)
    root_handler = logging.StreamHandler(stream or sys.stderr)
    root_handler.setFormatter(formatter)
    root_handler.addFilter(for_console)
    root.addHandler(root_handler)
    for noisy in ("httpcore", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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
