"""`ToolEnv` (stateless Python functions as tools) and `StatefulToolEnv`
(tools with hidden per-rollout arguments injected by `update_tool_args`).

A tool that raises produces a tool message (`error_formatter(exc)`) and the
rollout continues — except for exceptions in `stop_errors` (the rollout ends
with a ToolCallError) and InfraErrors anywhere in the cause chain (they
propagate as the rollout's error, so `--max-retries` re-runs it).

A sync tool runs in the env's thread pool (`self.sync_pool`, sized by
`set_concurrency`), an async one on the event loop.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from .decorators import stop
from .errors import ToolCallError, ToolParseError, is_infra_error
from .multi_turn import MultiTurnEnv
from .rubrics.rubric import Rubric
from .tool_schema import convert_func_to_tool_def, tool_message_content
from .types import Messages, State, Tool


def _tool_name(tool: Callable[..., Any]) -> str:
    return getattr(tool, "__name__", type(tool).__name__)


class ToolMonitorRubric(Rubric):
    """Metrics: total_tool_calls and <tool>_calls per tool."""

    def __init__(self, tool_names: list[str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.tool_names: list[str] = []
        self.add_metric(self.total_tool_calls)
        for name in tool_names or []:
            self.add_tool_metric(name)

    def total_tool_calls(self, state: State) -> float:
        return float(sum((state.get("tool_call_counts") or {}).values()))

    def add_tool_metric(self, name: str) -> None:
        metric_name = f"{name}_calls"
        if name not in self.tool_names:
            self.tool_names.append(name)
        if metric_name in self.get_reward_func_names():
            return

        def count(state: State) -> float:
            return float((state.get("tool_call_counts") or {}).get(name, 0))

        count.__name__ = metric_name
        self.add_metric(count)

    def remove_tool_metric(self, name: str) -> None:
        self.remove_reward_func(f"{name}_calls")
        if name in self.tool_names:
            self.tool_names.remove(name)


class ToolEnv(MultiTurnEnv):
    """Tool calling with Python functions (their signatures become the schemas)."""

    def __init__(
        self,
        tools: list[Callable[..., Any]] | None = None,
        max_turns: int = 10,
        error_formatter: Callable[[Exception], str] = lambda e: f"{e}",
        stop_errors: list[type[Exception]] | None = None,
        **kwargs: Any,
    ):
        self.tools: list[Callable[..., Any]] = []
        self.tool_defs: list[Tool] = []
        self.tool_map: dict[str, Callable[..., Any]] = {}
        self.skipped_args: dict[str, list[str]] = {}
        self.error_formatter = error_formatter
        self.stop_errors: tuple[type[Exception], ...] = tuple(stop_errors or ())
        super().__init__(max_turns=max_turns, **kwargs)
        self.tool_monitor_rubric = ToolMonitorRubric()
        self.add_rubric(self.tool_monitor_rubric)
        for tool in tools or []:
            self.add_tool(tool)

    # ---- tool registry
    def add_tool(self, tool: Callable[..., Any], args_to_skip: list[str] | None = None) -> None:
        """Expose `tool`; arguments in `args_to_skip` are hidden from the model's schema
        (StatefulToolEnv injects them in update_tool_args)."""
        name = _tool_name(tool)
        if name in self.tool_map:
            self.remove_tool(self.tool_map[name])
        self.tools.append(tool)
        self.tool_defs.append(convert_func_to_tool_def(tool, skip=args_to_skip))
        self.tool_map[name] = tool
        self.skipped_args[name] = list(args_to_skip or [])
        self.tool_monitor_rubric.add_tool_metric(name)

    def remove_tool(self, tool: Callable[..., Any] | str) -> None:
        name = tool if isinstance(tool, str) else _tool_name(tool)
        fn = self.tool_map.pop(name, None)
        if fn is not None and fn in self.tools:
            self.tools.remove(fn)
        self.tool_defs = [t for t in self.tool_defs if t.name != name]
        self.skipped_args.pop(name, None)
        self.tool_monitor_rubric.remove_tool_metric(name)

    # ---- stop condition
    @stop
    async def no_tools_called(self, state: State) -> bool:
        if not state["trajectory"]:
            return False
        completion = state["trajectory"][-1]["completion"]
        if isinstance(completion, str) or not completion:
            return True
        return not completion[-1].get("tool_calls")

    # ---- execution
    def _is_stop_error(self, exc: BaseException) -> bool:
        return bool(self.stop_errors) and isinstance(exc, self.stop_errors)

    async def call_tool(self, tool_name: str, tool_args: dict[str, Any], tool_call_id: str, **kwargs: Any) -> dict[str, Any]:
        """Run one tool and return its tool message. Raises when the tool raises."""
        fn = self.tool_map.get(tool_name)
        if fn is None:
            raise KeyError(f"unknown tool {tool_name!r}; available: {sorted(self.tool_map)}")
        result = await self.sync_pool.call(fn, **tool_args)
        return {"role": "tool", "content": tool_message_content(result), "tool_call_id": tool_call_id}

    async def _prepare_args(self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State, **kwargs: Any) -> dict[str, Any]:
        return tool_args

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        assert isinstance(messages, list)
        last = messages[-1]
        out: list[dict[str, Any]] = []
        counts = state.setdefault("tool_call_counts", {})
        for call in last.get("tool_calls") or []:
            call_id = call.get("id", "")
            fn = call.get("function", {})
            name = fn.get("name", "")
            try:
                args = json.loads(fn.get("arguments") or "{}")
                if not isinstance(args, dict):
                    raise ValueError(f"tool arguments must be a JSON object, got {type(args).__name__}")
            except Exception as exc:
                if self._is_stop_error(exc):
                    raise ToolParseError(f"cannot parse arguments of {name}: {exc}") from exc
                out.append({"role": "tool", "content": self.error_formatter(exc), "tool_call_id": call_id})
                continue
            counts[name] = counts.get(name, 0) + 1
            try:
                args = await self._prepare_args(name, args, messages, state, **kwargs)
                out.append(await self.call_tool(name, args, call_id))
            except Exception as exc:
                if is_infra_error(exc):
                    raise
                if self._is_stop_error(exc):
                    raise ToolCallError(f"tool {name} failed: {type(exc).__name__}: {exc}") from exc
                out.append({"role": "tool", "content": self.error_formatter(exc), "tool_call_id": call_id})
        return out


class StatefulToolEnv(ToolEnv):
    """Tools that need per-rollout state: override `setup_state` and
    `update_tool_args` to inject hidden arguments (e.g. a sandbox handle) that
    never appear in the tool schema (add such tools with `args_to_skip`)."""

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State, **kwargs: Any
    ) -> dict[str, Any]:
        """Return the arguments to call `tool_name` with (may be async)."""
        return tool_args

    async def _prepare_args(self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State, **kwargs: Any) -> dict[str, Any]:
        result = self.update_tool_args(tool_name, tool_args, messages, state, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result if result is not None else tool_args
