"""Errors of the env / rubric / eval stack.

`Error`, `InfraError` and `ModelError` are the very classes of
`sandboxes.errors` (one hierarchy for the whole project); the env-level
subclasses below add tool and prompt failures.

In a results row an error appears twice, as the reference documents it:
`error` is a string ("Type: message", `error_text`) or None, and
`error_info` the typed details (`error_record`: type, kind, message, chain,
traceback). `error_text` also reads rows written before `error_info`
existed, whose `error` was that dict.
"""

from __future__ import annotations

import traceback as _traceback
from collections.abc import Callable
from typing import Any

from sandboxes.errors import Error, InfraError, ModelError, SandboxError, UsageError, find_infra_error, is_infra_error, iter_causes

__all__ = [
    "EmptyModelResponseError",
    "Error",
    "ErrorChain",
    "InfraError",
    "InvalidModelResponseError",
    "MissingKeyError",
    "ModelError",
    "OverlongPromptError",
    "SandboxError",
    "ScoringError",
    "ToolCallError",
    "ToolError",
    "ToolParseError",
    "UsageError",
    "error_kind",
    "error_record",
    "error_text",
    "find_infra_error",
    "get_error_chain",
    "get_vf_error_chain",
    "is_infra_error",
]


class InvalidModelResponseError(ModelError):
    """The model answered something unusable (no choices, malformed)."""


class EmptyModelResponseError(InvalidModelResponseError):
    """The model answered with neither content nor tool calls."""


class OverlongPromptError(Error):
    """The prompt exceeds the model's context (max_seq_len)."""


class ScoringError(Error):
    """A reward or metric function raised: its rollout scores 0 and carries this
    error (the function's exception is the cause, so an InfraError there still
    makes it an infrastructure row); the other rollouts of the group are scored."""


class ToolError(Error):
    """A tool call failed in a way that ends the rollout (see ToolEnv.stop_errors)."""


class ToolParseError(ToolError):
    """The model's tool-call arguments could not be parsed."""


class ToolCallError(ToolError):
    """A tool raised one of the env's stop_errors."""


class MissingKeyError(ValueError):
    """Required environment variables are not set."""

    def __init__(self, keys: list[str]):
        self.keys = list(keys)
        names = ", ".join(self.keys)
        super().__init__(
            f"missing environment variable(s): {names}. Set them, e.g. `export {self.keys[0]}=...`, and retry."
        )


def error_kind(exc: BaseException) -> str:
    """"infra" (retryable: InfraError in the cause chain), "model" or "task"."""
    if is_infra_error(exc):
        return "infra"
    for cur in iter_causes(exc):
        if isinstance(cur, ModelError):
            return "model"
    return "task"


MESSAGE_LIMIT = 2000
TRACEBACK_LIMIT = 8000


def error_record(exc: BaseException) -> dict[str, Any]:
    """{"type", "message", "kind", "chain", "traceback"} for a rollout's
    `error_info` (message and traceback bounded; the traceback keeps its end)."""
    chain = [type(c).__name__ for c in iter_causes(exc)]
    tb = "".join(_traceback.format_exception(exc)) if exc.__traceback__ is not None or exc.__cause__ is not None else ""
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MESSAGE_LIMIT],
        "kind": error_kind(exc),
        "chain": chain,
        "traceback": tb[-TRACEBACK_LIMIT:] or None,
    }


def error_text(err: Any) -> str | None:
    """"Type: message" (or "Type") for an exception, an `error_record` dict
    (also the old row shape) or a string (returned as is); None for no error."""
    if err is None or err == "" or err == {}:
        return None
    if isinstance(err, BaseException):
        msg = str(err)[:MESSAGE_LIMIT]
        return f"{type(err).__name__}: {msg}" if msg else type(err).__name__
    if isinstance(err, dict):
        t = next((err[k] for k in ("type", "error", "error_type", "name") if isinstance(err.get(k), str) and err[k]), "error")
        msg = err.get("message") or err.get("error_chain_str") or ""
        return f"{t}: {msg}" if msg else t
    return str(err)


# --------------------------------------------------------------------------- error chains (the reference's error_utils)
def get_error_chain(error: BaseException | None, parent_type: type[BaseException] | None = None) -> list[BaseException]:
    """`error` and its `__cause__`s, outermost first; with `parent_type`, up to the first
    error that is not one."""
    chain: list[BaseException] = []
    while error is not None:
        if parent_type is not None and not isinstance(error, parent_type):
            break
        chain.append(error)
        error = error.__cause__
    return chain


def get_vf_error_chain(error: BaseException) -> list[Error]:
    """The leading part of the cause chain made of vf errors."""
    return get_error_chain(error, parent_type=Error)  # type: ignore[return-value]


class ErrorChain:
    """A cause chain compared, hashed and printed by its exception types
    (`ErrorChain(e) == ErrorChain(f)` when their chains have the same type names;
    `ToolError in chain` when one of them is a ToolError)."""

    def __init__(self, error: BaseException, build_error_chain: Callable[[BaseException], list[BaseException]] = get_error_chain):
        self.root_error = error
        self.chain = build_error_chain(error)

    def _names(self) -> tuple[str, ...]:
        return tuple(type(e).__name__ for e in self.chain)

    def __hash__(self) -> int:
        return hash(self._names())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ErrorChain):
            return NotImplemented
        return self._names() == other._names()

    def __contains__(self, error_cls: type[BaseException]) -> bool:
        return any(isinstance(e, error_cls) for e in self.chain)

    def __str__(self) -> str:
        return " -> ".join(self._names())

    def __repr__(self) -> str:
        return " -> ".join(repr(e) for e in self.chain)
