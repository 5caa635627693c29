"""Simulated users for the base tool loop (`Harness(user=...)`,
`Taskset(user=...)`, `UserConfig`).

A user is `fn(task, state, message) -> reply`: `message` is the text of the
model's last answer, and `reply` a string (one user message), a message
dict, a list of messages, or None / "" / [] to end the conversation. The
base loop calls it each time the model answers without calling a tool, up to
`max_turns` replies, and sends the reply as the next user message(s); a task
with no prompt is opened by the user (`fn(task, state, "")`). A sync `fn`
runs off the event loop like every other user code. A user that declines
ends the rollout with stop condition "user_done"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandboxes.errors import ConfigError

from .config import UserConfig, resolve_ref


@dataclass(frozen=True)
class User:
    fn: Callable[..., Any]
    max_turns: int = 1


def user_of(value: Any) -> User | None:
    """A `User` from a callable, a "module:object" ref, a mapping / UserConfig, or None."""
    value = resolve_ref(value)
    if value is None or isinstance(value, User):
        return value
    if callable(value):
        return User(fn=value)
    if isinstance(value, (Mapping, UserConfig)):
        cfg = UserConfig.from_config(value)
        fn = resolve_ref(cfg.fn)
        if not callable(fn):
            raise ConfigError(f"UserConfig.fn must be a callable or a 'module:object' ref, not {cfg.fn!r}")
        if cfg.max_turns < 1:
            raise ConfigError(f"UserConfig.max_turns must be at least 1, got {cfg.max_turns}")
        return User(fn=fn, max_turns=cfg.max_turns)
    raise ConfigError(f"a user is a callable, a 'module:object' ref or a UserConfig, not {type(value).__name__}")


def user_messages(reply: Any) -> list[dict[str, Any]]:
    """The user's reply as messages ([] when the user ends the conversation)."""
    if reply is None or reply == "":
        return []
    if isinstance(reply, str):
        return [{"role": "user", "content": reply}]
    if isinstance(reply, Mapping):
        return [{"role": "user", **dict(reply)}]
    return [{"role": "user", **dict(m)} if isinstance(m, Mapping) else {"role": "user", "content": str(m)}
            for m in reply]
