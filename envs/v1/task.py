"""`Task`: the immutable, JSON-serialisable input of one v1 rollout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandboxes.errors import ConfigError

TASK_FIELDS = ("prompt", "system_prompt", "answer", "info", "max_turns", "tools", "toolsets", "sandbox", "program",
               "example_id")


def normalise_prompt(prompt: Any) -> list[dict[str, Any]]:
    """A str becomes one user message; a list of messages is copied. System messages
    are refused (they belong in `system_prompt`)."""
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    msgs = [dict(m) for m in prompt]
    if any(m.get("role") == "system" for m in msgs):
        raise ConfigError("a task's prompt must not contain system messages; use its system_prompt")
    return msgs


class Task(dict):
    """A dict of task fields (prompt, system_prompt, answer, info, max_turns, tools,
    toolsets, sandbox, program, example_id, plus any serialisable extras).
    `freeze()` makes it read-only; a Taskset hands out frozen tasks."""

    _frozen = False

    def __init__(self, data: Mapping[str, Any] | None = None, /, **fields: Any):
        merged = {**(dict(data) if data else {}), **fields}
        if "prompt" not in merged and "question" in merged:
            merged["prompt"] = merged.pop("question")
        if "runtime" in merged:
            raise ConfigError("task.runtime is not task data: runtime belongs on State")
        merged["prompt"] = normalise_prompt(merged.get("prompt"))
        super().__init__(merged)

    def freeze(self) -> "Task":
        self._frozen = True
        return self

    @property
    def frozen(self) -> bool:
        return self._frozen

    def _check(self) -> None:
        if self._frozen:
            raise TypeError("a frozen Task is immutable; copy it with Task(task, field=...)")

    def __setitem__(self, key: str, value: Any) -> None:
        self._check()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._check()
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._check()
        super().update(*args, **kwargs)

    def pop(self, *args: Any) -> Any:  # type: ignore[override]
        self._check()
        return super().pop(*args)

    def setdefault(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._check()
        return super().setdefault(key, default)

    def __reduce__(self) -> Any:  # pickles (forked workers) as a plain, unfrozen copy
        return (Task, (dict(self),))
