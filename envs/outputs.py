"""Turning finished rollout states into output rows and aggregate metadata
(avg reward / metrics / error, pass@k, pass-all-k, token usage).

A row whose rollout ended in an infrastructure error (`is_infra_row`: the
sandbox died, the agent broke, the engine did not answer, retries spent) has
no result on the task: `aggregate` leaves it out of every average and counts
it apart (`infra_errors`), the eval runner calls such a run `incomplete`, and
`--resume` runs those rollouts again."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .errors import error_record, error_text
from .pass_at_k import pass_at_k
from .types import RolloutOutput, State

# State keys that are never copied into an output row (live handles, internals,
# and the keys serialised explicitly below).
_INTERNAL = frozenset({"client", "input", "sampling_args", "tool_defs", "timing", "trajectory", "error"})

# Upper bound on a row's trajectory (characters of message text, roughly its JSON
# size). Each step's prompt repeats the conversation so far, so a long multi-turn
# rollout grows quadratically; past the bound the oldest steps are dropped (their
# messages are still in the later steps' prompts) and `trajectory_dropped_steps`
# says how many. The last step is always kept.
TRAJECTORY_MAX_CHARS = 1_000_000


def state_to_output(state: State, state_columns: list[str] | None = None) -> RolloutOutput:
    """One JSON-able results row for a finished rollout (fields as the reference's
    RolloutOutput: `error` a string or None, `trajectory` a list of TrajectoryStep,
    `tool_defs`; plus `error_info` with the typed details, `error_type`,
    `error_kind`, `attempts`)."""
    err = state.get("error")
    if isinstance(err, BaseException):
        info: dict[str, Any] | None = error_record(err)
    elif isinstance(err, dict):
        info = err
    else:
        info = {"type": "error", "message": str(err), "kind": "task", "chain": [], "traceback": None} if err else None
    timing = state.get("timing")
    trajectory, dropped = serialize_trajectory(state.get("trajectory") or [])
    tool_defs = state.get("tool_defs")
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
        error=error_text(info) if info else None,
        error_info=info,
        error_type=info.get("type") if info else None,
        error_kind=info.get("kind") if info else None,
        attempts=int(state.get("attempts", 1)),
        timing=timing.model_dump() if hasattr(timing, "model_dump") else timing,
        token_usage=dict(state.get("usage") or {}),
        tool_defs=[_dump(t) for t in tool_defs] if tool_defs else None,
        trajectory=trajectory,
    )
    if dropped:
        out["trajectory_dropped_steps"] = dropped
    for col in state_columns or ():
        if col not in _INTERNAL:
            out[col] = state.get(col)
    return out


def _dump(obj: Any) -> Any:
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


def _jsonable(value: Any) -> Any:
    """`value` if JSON can encode it, else its model_dump() / str()."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _chars(messages: Any) -> int:
    """Rough size of a Messages value (text, tool-call arguments)."""
    if isinstance(messages, str):
        return len(messages)
    n = 0
    for m in messages or ():
        if isinstance(m, dict):
            content = m.get("content")
            n += len(content) if isinstance(content, str) else len(str(content or ""))
            for tc in m.get("tool_calls") or ():
                n += len(str(tc))
        else:
            n += len(str(m))
    return n


def serialize_trajectory(steps: list[Any], max_chars: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """(JSON-able TrajectoryStep dicts, number of oldest steps dropped to stay
    within `max_chars`, default TRAJECTORY_MAX_CHARS)."""
    if max_chars is None:
        max_chars = TRAJECTORY_MAX_CHARS
    keep_from, total = len(steps), 0
    for i in range(len(steps) - 1, -1, -1):
        step = steps[i]
        total += _chars(step.get("prompt")) + 2 * _chars(step.get("completion"))  # the response repeats the completion
        if total > max_chars and i < len(steps) - 1:
            break
        keep_from = i
    out = []
    for step in steps[keep_from:]:
        tokens = step.get("tokens")
        out.append({
            "prompt": step.get("prompt"),
            "completion": step.get("completion"),
            "response": _dump(step.get("response")),
            "tokens": _jsonable(tokens) if tokens is not None else None,
            "reward": step.get("reward"),
            "advantage": step.get("advantage"),
            "is_truncated": bool(step.get("is_truncated", False)),
            "trajectory_id": step.get("trajectory_id"),
            "extras": _jsonable(step.get("extras") or {}),
        })
    return out, keep_from


def is_infra_row(row: dict[str, Any]) -> bool:
    """The row's rollout ended in an infrastructure error (retries spent): no result on the task."""
    if not row.get("error"):
        return False
    err, info = row.get("error"), row.get("error_info")
    kind = row.get("error_kind") or (info.get("kind") if isinstance(info, dict) else None) or (
        err.get("kind") if isinstance(err, dict) else None)
    return kind == "infra"


def aggregate(outputs: list[dict[str, Any]], pass_threshold: float = 0.5) -> dict[str, Any]:
    """avg_reward, avg_metrics, avg_error, pass_at_k, pass_all_k, usage over the scored rows;
    rows that ended in an infrastructure error are left out and counted in `infra_errors`."""
    infra = sum(1 for row in outputs if is_infra_row(row))
    outputs = [row for row in outputs if not is_infra_row(row)]
    n = len(outputs)
    if n == 0:
        return {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0, "pass_at_k": {}, "pass_all_k": {}, "usage": None,
                "scored_rollouts": 0, "infra_errors": infra}
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
        "scored_rollouts": n,
        "infra_errors": infra,
    }
