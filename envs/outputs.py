"""Turning finished rollout states into output rows and aggregate metadata
(avg reward / metrics / error, pass@k, pass-all-k, token usage)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .errors import error_record
from .pass_at_k import pass_at_k
from .types import RolloutOutput, State

# State keys that are never copied into an output row (live handles, internals).
_INTERNAL = frozenset({"client", "input", "sampling_args", "tool_defs", "timing", "trajectory", "error"})


def state_to_output(state: State, state_columns: list[str] | None = None) -> RolloutOutput:
    """One JSON-able results row for a finished rollout."""
    err = state.get("error")
    record = error_record(err) if isinstance(err, BaseException) else err
    timing = state.get("timing")
    out = RolloutOutput(
        example_id=state.get("example_id"),
        prompt=state.get("prompt"),
        completion=state.get("completion"),
        answer=state.get("answer", ""),
        task=state.get("task", "default"),
        info=state.get("info") or {},
        reward=state.get("reward") if state.get("reward") is not None else 0.0,
        advantage=state.get("advantage"),
        metrics=state.get("metrics") or {},
        is_completed=bool(state.get("is_completed", False)),
        is_truncated=bool(state.get("is_truncated", False)),
        stop_condition=state.get("stop_condition"),
        error=record,
        error_type=record["type"] if record else None,
        error_kind=record["kind"] if record else None,
        attempts=int(state.get("attempts", 1)),
        timing=timing.model_dump() if hasattr(timing, "model_dump") else timing,
        token_usage=dict(state.get("usage") or {}),
    )
    for col in state_columns or ():
        if col == "trajectory":
            out["trajectory"] = [
                {
                    "prompt": step["prompt"],
                    "completion": step["completion"],
                    "reward": step.get("reward"),
                    "is_truncated": step.get("is_truncated", False),
                    "response": step["response"].model_dump() if hasattr(step.get("response"), "model_dump") else None,
                }
                for step in state.get("trajectory") or []
            ]
        elif col not in _INTERNAL:
            out[col] = state.get(col)
    return out


def aggregate(outputs: list[dict[str, Any]], pass_threshold: float = 0.5) -> dict[str, Any]:
    """avg_reward, avg_metrics, avg_error, pass_at_k, pass_all_k, usage over rows."""
    n = len(outputs)
    if n == 0:
        return {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0, "pass_at_k": {}, "pass_all_k": {}, "usage": None}
    metric_sums: dict[str, float] = defaultdict(float)
    metric_counts: dict[str, int] = defaultdict(int)
    by_example: dict[Any, list[float]] = defaultdict(list)
    usage: dict[str, float] = defaultdict(float)
    reward_sum = 0.0
    errors = 0
    for row in outputs:
        reward = float(row.get("reward") or 0.0)
        reward_sum += reward
        errors += 1 if row.get("error") else 0
        by_example[row.get("example_id")].append(reward)
        for key, value in (row.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                metric_sums[key] += value
                metric_counts[key] += 1
        for key, value in (row.get("token_usage") or {}).items():
            if isinstance(value, (int, float)):
                usage[key] += value
    p_any, p_all = pass_at_k(by_example, pass_threshold)
    return {
        "avg_reward": reward_sum / n,
        "avg_metrics": {k: metric_sums[k] / metric_counts[k] for k in metric_sums},
        "avg_error": errors / n,
        "pass_at_k": p_any,
        "pass_all_k": p_all,
        "usage": {k: v / n for k, v in usage.items()} if usage else None,
    }
