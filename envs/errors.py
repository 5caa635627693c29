"""Errors of the env / rubric / eval stack.

`Error`, `InfraError` and `ModelError` are the very classes of
`sandboxes.errors` (one hierarchy for the whole project); the env-level
subclasses below add tool and prompt failures. `error_record(exc)` turns an
exception into the JSON-able dict stored in a rollout's output.
"""

from __future__ import annotations

from typing import Any

from sandboxes.errors import Error, InfraError, ModelError, UsageError, find_infra_error, is_infra_error, iter_causes

__all__ = [
    "EmptyModelResponseError",
    "Error",
    "InfraError",
    "InvalidModelResponseError",
    "MissingKeyError",
    "ModelError",
    "OverlongPromptError",
    "ToolCallError",
    "ToolError",
    "ToolParseError",
    "UsageError",
    "error_kind",
    "error_record",
    "find_infra_error",
    "is_infra_error",
]


class InvalidModelResponseError(ModelError):
    """The model answered something unusable (no choices, malformed)."""


class EmptyModelResponseError(InvalidModelResponseError):
    """The model answered with neither content nor tool calls."""


class OverlongPromptError(Error):
    """The prompt exceeds the model's context (max_seq_len)."""


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


def error_record(exc: BaseException) -> dict[str, Any]:
    """{"type", "message", "kind", "chain"} for a rollout's output."""
    chain = [type(c).__name__ for c in iter_causes(exc)]
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "kind": error_kind(exc),
        "chain": chain,
    }
