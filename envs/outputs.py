"""Turning finished rollout states into output rows and aggregate metadata
(avg reward / metrics / error, pass@k, pass-all-k, token usage).

Every row has a verdict (`row["verdict"]`, `verdict_of`):

- `scored`: the reward was computed. A task failure is scored too: the
  model's bad tool call (ToolError), an overlong prompt, and whatever the
  sandbox's own code did (OOM, timeout, fork bomb: `sandbox_oom` /
  `sandbox_timeout` flags) -- the row keeps its error text, its reward counts;
- `model`: the model endpoint failed (unreachable, HTTP status, timeout,
  unusable response);
- `sandbox`: the infrastructure failed (sandbox died, agent broke, engine did
  not answer; an `InfraError` in the cause chain);
- `env`: the environment's own code raised (setup, parser, a reward
  function: a `ScoringError`), traceback in `error_info`;
- `usage`: a usage / configuration error.

A row whose verdict is not `scored` has no result on the task: `aggregate`
leaves it out of every average and pass@k (pass@k also leaves out the other
rollouts of its example: a group with an errored rollout is not used for
group-relative numbers), counts it apart (`errored_rollouts`, `errors_by_kind`;
`infra_errors` are the `sandbox` ones), the eval runner calls such a run
`incomplete` (exit 3) and `--resume` runs those rollouts again."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .errors import OverlongPromptError, ToolError, error_record, error_text
from .pass_at_k import pass_at_k
from .types import RolloutOutput, State

VERDICTS = ("scored", "model", "sandbox", "env", "usage")
ERROR_VERDICTS = ("model", "sandbox", "env", "usage")
# error types whose rollout is a task failure (scored, reward counts): the model's own doing
_TASK_FAILURES = (ToolError, OverlongPromptError)
_TASK_FAILURE_NAMES = frozenset({"ToolError", "ToolParseError", "ToolCallError", "OverlongPromptError"})

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
    info, verdict = _error_info(state.get("error"))
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
        verdict=verdict,
        timing=timing.model_dump() if hasattr(timing, "model_dump") else timing,
        token_usage=dict(state.get("usage") or {}),
        tool_defs=[_dump(t) for t in tool_defs] if tool_defs else None,
        trajectory=trajectory,
    )
    _add_optional_fields(out, state, dropped, state_columns)
    return out


def _error_info(err: Any) -> tuple[dict[str, Any] | None, str]:
    """(error_info record or None, verdict) of a rollout whose state's `error` is `err`: an
    exception (typed record, plus a model endpoint's HTTP status), a record already, or any
    other truthy value (a task error with its text). The record carries its verdict."""
    if isinstance(err, BaseException):
        info: dict[str, Any] | None = error_record(err)
        status = _http_status(err)
        if status is not None:  # a model endpoint's HTTP status (429, 5xx, ...)
            info["status"] = status
    elif isinstance(err, dict):
        info = err
    else:
        info = {"type": "error", "message": str(err), "kind": "task", "chain": [], "traceback": None} if err else None
    verdict = error_verdict(err if isinstance(err, BaseException) else info) if info else "scored"
    if info is not None:
        info.setdefault("verdict", verdict)
    return info, verdict


def _add_optional_fields(out: RolloutOutput, state: State, dropped: int, state_columns: list[str] | None) -> None:
    """Add to `out` the fields present only when they say something (dropped trajectory steps,
    attempt and scoring errors) and the requested `state_columns` (internal keys never)."""
    if dropped:
        out["trajectory_dropped_steps"] = dropped
    if state.get("attempt_errors"):
        out["attempt_errors"] = list(state["attempt_errors"])
    if state.get("scoring_errors"):  # a rubric that opted in to "an exception scores 0" says so here
        out["scoring_errors"] = list(state["scoring_errors"])
    for col in state_columns or ():
        if col not in _INTERNAL:
            out[col] = state.get(col)


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


def _http_status(err: BaseException) -> int | None:
    from sandboxes.errors import iter_causes

    for cur in iter_causes(err):
        status = getattr(cur, "status", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def error_verdict(err: BaseException | dict[str, Any] | None) -> str:
    """The verdict of a rollout that ended with `err` (an exception, or its `error_info`
    record): "scored" for a task failure, else the error's kind (module docstring)."""
    if err is None:
        return "scored"
    if isinstance(err, BaseException):
        from sandboxes.errors import UsageError, iter_causes

        from .errors import error_kind

        kind = error_kind(err)
        if kind == "infra":
            return "sandbox"
        if kind == "model":
            return "model"
        causes = list(iter_causes(err))
        if any(isinstance(c, UsageError) for c in causes):
            return "usage"
        return "scored" if isinstance(err, _TASK_FAILURES) else "env"
    if not isinstance(err, dict):
        return "env"
    verdict = err.get("verdict")
    if verdict in VERDICTS:
        return verdict
    kind = err.get("kind")
    if kind == "infra":
        return "sandbox"
    if kind == "model":
        return "model"
    if err.get("type") in _TASK_FAILURE_NAMES:
        return "scored"
    return "env"


def verdict_of(row: dict[str, Any]) -> str:
    """A results row's verdict: its `verdict` field, or (rows written before verdicts
    existed) derived from its error."""
    verdict = row.get("verdict")
    if verdict in VERDICTS:
        return verdict
    err = row.get("error")
    if not err:
        return "scored"
    info = row.get("error_info")
    if not isinstance(info, dict):
        info = err if isinstance(err, dict) else {"type": str(err).split(":", 1)[0]}
    if row.get("error_kind") and "kind" not in info:
        info = {**info, "kind": row["error_kind"]}
    return error_verdict(info)


def is_scored(row: dict[str, Any]) -> bool:
    """The row has a result on its task (its reward counts)."""
    return verdict_of(row) == "scored"


def is_infra_row(row: dict[str, Any]) -> bool:
    """The row's rollout ended in an infrastructure (sandbox) error: no result on the task."""
    return verdict_of(row) == "sandbox"


def verdict_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """{"scored": n, "errored": n, "model": n, "sandbox": n, "env": n, "usage": n}."""
    counts = dict.fromkeys(VERDICTS, 0)
    for row in rows:
        counts[verdict_of(row)] += 1
    counts["errored"] = len(rows) - counts["scored"]
    return counts


def aggregate(outputs: list[dict[str, Any]], pass_threshold: float = 0.5) -> dict[str, Any]:
    """avg_reward, avg_metrics, pass_at_k, pass_all_k, usage over the scored rows (avg_error:
    the share of all rows with an error);
    rows with an error verdict are left out and counted apart (`errored_rollouts`,
    `errors_by_kind`, `infra_errors` = the sandbox ones); pass@k leaves out every example
    with an errored rollout."""
    verdicts = [verdict_of(row) for row in outputs]  # once per row
    counts = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        counts[v] += 1
    counts["errored"] = len(outputs) - counts["scored"]
    total = len(outputs)
    with_error = sum(1 for row in outputs if row.get("error"))  # the error rate is over every row
    errored_examples = {row.get("example_id") for row, v in zip(outputs, verdicts) if v != "scored"}
    outputs = [row for row, v in zip(outputs, verdicts) if v == "scored"]
    n = len(outputs)
    apart = {"scored_rollouts": n, "errored_rollouts": counts["errored"],
             "errors_by_kind": {k: counts[k] for k in ERROR_VERDICTS if counts[k]},
             "infra_errors": counts["sandbox"]}
    if n == 0:
        return {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": with_error / total if total else 0.0, "pass_at_k": {}, "pass_all_k": {}, "usage": None,
                **apart}
    reward_sum, avg_metrics, by_example, usage = _scored_sums(outputs, errored_examples)
    p_any, p_all = pass_at_k(by_example, pass_threshold)
    return {
        "avg_reward": reward_sum / n,
        "avg_metrics": avg_metrics,
        "avg_error": with_error / total,
        "pass_at_k": p_any,
        "pass_all_k": p_all,
        "usage": {k: v / n for k, v in usage.items()} if usage else None,
        **apart,
    }


def _scored_sums(rows: list[dict[str, Any]], errored_examples: set[Any]
                 ) -> tuple[float, dict[str, float], dict[Any, list[float]], dict[str, float]]:
    """Over the scored `rows`: (reward sum, average of each numeric metric over the rows that have it,
    rewards by example for pass@k (examples in `errored_examples` left out), token usage sums)."""
    metric_sums: dict[str, float] = defaultdict(float)
    metric_counts: dict[str, int] = defaultdict(int)
    by_example: dict[Any, list[float]] = defaultdict(list)
    usage: dict[str, float] = defaultdict(float)
    reward_sum = 0.0
    for row in rows:
        reward = float(row.get("reward") or 0.0)
        reward_sum += reward
        if row.get("example_id") not in errored_examples:
            by_example[row.get("example_id")].append(reward)
        for key, value in (row.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                metric_sums[key] += value
                metric_counts[key] += 1
        for key, value in (row.get("token_usage") or {}).items():
            if isinstance(value, (int, float)):
                usage[key] += value
    avg_metrics = {k: metric_sums[k] / metric_counts[k] for k in metric_sums}
    return reward_sum, avg_metrics, by_example, usage


def make_dataset(results: Any) -> Any:
    """A `datasets.Dataset` of the rows of a `GenerateOutputs` (as the reference's
    `save_utils.make_dataset`; what `generate(push_to_hf_hub=True)` pushes)."""
    from datasets import Dataset

    return Dataset.from_list([dict(o) for o in results["outputs"]])
