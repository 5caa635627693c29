"""Read a run's outputs and summarise them: aggregate reward and metrics with
their spread, pass@k, errors by type, timing percentiles, reward histogram
(eval runs: `results.jsonl` + `metadata.json`), or reasons and phase timings
(swe-debug runs: an eval row per instance, its verdict in `info.verdict`;
rows of older runs held the verdict at the top level). Also the grouped
samples view.

Rows are read defensively: the writers may add, omit or rename optional
fields, and a run still being written may end in a partial line.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from envs.errors import error_text
from envs.pass_at_k import pass_at_k
from runs.registry import RunRecord

_cache: dict[str, tuple[tuple[float, int], list[dict]]] = {}


# -------------------------------------------------------------------- reading


def read_jsonl(path: str | os.PathLike[str]) -> list[dict]:
    """Rows of a JSONL file (cached on mtime+size); bad or partial lines skipped."""
    p = str(path)
    try:
        st = os.stat(p)
    except OSError:
        return []
    key = (st.st_mtime, st.st_size)
    hit = _cache.get(p)
    if hit and hit[0] == key:
        return hit[1]
    rows: list[dict] = []
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    if len(_cache) > 32:
        _cache.clear()
    _cache[p] = (key, rows)
    return rows


def read_metadata(output_dir: str) -> dict:
    try:
        with open(Path(output_dir) / "metadata.json", encoding="utf-8") as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def result_files(rec: RunRecord) -> list[Path]:
    """The JSONL files holding a run's rows."""
    p = Path(rec.output_dir)
    if p.is_file():
        return [p]
    if (p / "results.jsonl").exists():
        return [p / "results.jsonl"]
    if p.is_dir():
        return sorted(x for x in p.glob("*.jsonl") if x.is_file())
    return []


def outputs_state(rec: RunRecord) -> str:
    """Where the run's results are: "saved" (result files exist), "not saved" (an
    eval run without -s), "deleted" (written once, gone now), "none yet" (running,
    nothing written) or "none" (ended before writing anything)."""
    if result_files(rec):
        return "saved"
    args = rec.args or {}
    if rec.kind == "eval" and args and not args.get("save_results") and not args.get("resume"):
        return "not saved"
    if rec.status == "running":
        return "none yet"
    return "deleted" if rec.completed > 0 else "none"


def read_rows(rec: RunRecord) -> list[dict]:
    rows: list[dict] = []
    for f in result_files(rec):
        rows.extend(read_jsonl(f))
    return rows


# ---------------------------------------------------------------- statistics


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(x):
        return float(x)
    return None


def spread(values: Iterable[float]) -> dict[str, float]:
    v = [x for x in values if x is not None]
    if not v:
        return {"n": 0, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    m = sum(v) / len(v)
    var = sum((x - m) ** 2 for x in v) / len(v)
    return {"n": len(v), "mean": m, "std": math.sqrt(var), "min": min(v), "max": max(v)}


def percentiles(values: Iterable[float]) -> dict[str, float]:
    v = sorted(x for x in values if x is not None)
    if not v:
        return {}

    def q(p: float) -> float:
        i = (len(v) - 1) * p
        lo, hi = math.floor(i), math.ceil(i)
        return v[lo] + (v[hi] - v[lo]) * (i - lo)

    return {"n": len(v), "mean": sum(v) / len(v), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": v[-1]}


def histogram(values: list[float], bins: int = 10) -> dict[str, list[float]]:
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(0.0, min(values)), max(1.0, max(values))
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for x in values:
        counts[min(int((x - lo) / width), bins - 1)] += 1
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts}


def error_type(err: Any) -> str | None:
    """The error's type name from a row's `error_info` / old-style `error`
    dict, or from a "Type: message" string (the row's `error`)."""
    if not err:
        return None
    if isinstance(err, dict):
        for key in ("type", "error", "error_type", "name"):
            if isinstance(err.get(key), str) and err[key]:
                return err[key]
        return "error"
    if isinstance(err, str):
        head = err.split(":", 1)[0].strip()
        return head if head and head.replace(".", "").replace("_", "").isalnum() else "error"
    return type(err).__name__


def _dur(x: Any) -> float | None:
    n = _num(x)
    if n is not None:
        return n
    if isinstance(x, dict):
        if _num(x.get("duration")) is not None:
            return float(x["duration"])
        if "spans" in x and isinstance(x["spans"], list):
            return sum(_dur(s) or 0.0 for s in x["spans"])
        s, e = _num(x.get("start")), _num(x.get("end"))
        if s is not None and e is not None and e >= s and s > 0:
            return e - s
    return None


def timing_phases(timing: Any) -> dict[str, float]:
    """Per-phase seconds from a row's `timing` (RolloutTiming or a flat dict)."""
    out: dict[str, float] = {}
    if not isinstance(timing, dict):
        return out
    for k, v in timing.items():
        if k in ("start_time",):
            continue
        d = _dur(v)
        if d is not None:
            out[k] = d
    if "total" not in out:
        g, s = timing.get("generation"), timing.get("scoring")
        if isinstance(g, dict) and isinstance(s, dict):
            gs, se = _num(g.get("start")), _num(s.get("end"))
            if gs and se and se >= gs:
                out["total"] = se - gs
    return out


def tools_called(row: dict) -> list[str]:
    """Names of the tools the model called, in order."""
    names: list[str] = []
    msgs = row.get("completion")
    if not isinstance(msgs, list):
        return names
    for m in msgs:
        if not isinstance(m, dict):
            continue
        for tc in m.get("tool_calls") or []:
            if isinstance(tc, dict):
                fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
                if isinstance(fn.get("name"), str):
                    names.append(fn["name"])
        content = m.get("content")
        if isinstance(content, list):  # Anthropic-style tool_use blocks
            for part in content:
                if isinstance(part, dict) and part.get("type") == "tool_use" and part.get("name"):
                    names.append(str(part["name"]))
    return names


# ------------------------------------------------------------------ summaries


def summarize_run(rec: RunRecord) -> dict:
    if rec.kind == "swe-debug":
        return summarize_swe(read_rows(rec))
    return summarize_eval(read_rows(rec), read_metadata(rec.output_dir))


def summarize_eval(rows: list[dict], meta: dict | None = None) -> dict:
    """An eval run's summary: reward (scored rows only) and metrics with their spread,
    pass@k over the examples none of whose rows errored, errors by type and kind, mean
    token usage, timing percentiles by phase, the reward histogram and the metadata."""
    meta = meta or {}
    threshold = _num(meta.get("pass_threshold"))
    threshold = 0.5 if threshold is None else threshold
    from envs.outputs import verdict_counts

    verdicts = verdict_counts(rows)  # rewards and pass@k: scored rows only (issue 26)
    rewards, groups = _scored_rewards(rows)
    metrics, usage, phases = _row_numbers(rows)
    errors, kinds = _error_counts(rows)
    at, allk = pass_at_k(groups, threshold)
    return {
        "kind": "eval",
        "n_rollouts": len(rows),
        "scored_rollouts": verdicts["scored"],
        "errored_rollouts": verdicts["errored"],
        "n_examples": len({r.get("example_id", f"row{i}") for i, r in enumerate(rows)}),
        "reward": spread(rewards),
        "metrics": {k: spread(v) for k, v in sorted(metrics.items())},
        "pass_threshold": threshold,
        "pass_at_k": at,
        "pass_all_k": allk,
        "errors_by_type": errors,
        "errors_by_kind": kinds,
        "avg_token_usage": {k: v / len(rows) for k, v in usage.items()} if rows else {},
        "error_rate": (sum(errors.values()) / len(rows)) if rows else 0.0,
        "timing": {k: percentiles(v) for k, v in sorted(phases.items())},
        "histogram": histogram(rewards),
        "metadata": {k: v for k, v in meta.items() if k not in ("tools",)},
    }


def _scored_rewards(rows: list[dict]) -> tuple[list[float], dict[Any, list[float]]]:
    """(the scored rows' rewards, those rewards by example for pass@k: examples with an
    errored row left out); a missing reward counts 0."""
    from envs.outputs import verdict_of

    errored_examples = {r.get("example_id") for r in rows if verdict_of(r) != "scored"}
    rewards: list[float] = []
    groups: dict[Any, list[float]] = {}
    for i, r in enumerate(rows):
        rw = _num(r.get("reward"))
        rw = 0.0 if rw is None else rw
        if verdict_of(r) == "scored":
            rewards.append(rw)
            if r.get("example_id") not in errored_examples:
                groups.setdefault(r.get("example_id", f"row{i}"), []).append(rw)
    return rewards, groups


def _row_numbers(rows: list[dict]) -> tuple[dict[str, list[float]], dict[str, float], dict[str, list[float]]]:
    """(each metric's values, the token usage summed over the rows, each timing phase's
    durations); metric and usage values that are not finite numbers are skipped."""
    metrics: dict[str, list[float]] = {}
    usage: dict[str, float] = {}
    phases: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("metrics") or {}).items() if isinstance(r.get("metrics"), dict) else ():
            n = _num(v)
            if n is not None:
                metrics.setdefault(k, []).append(n)
        tu = r.get("token_usage")
        for k, v in (tu.items() if isinstance(tu, dict) else ()):
            n = _num(v)
            if n is not None:
                usage[k] = usage.get(k, 0.0) + n
        for k, v in timing_phases(r.get("timing")).items():
            phases.setdefault(k, []).append(v)
    return metrics, usage, phases


def _error_counts(rows: list[dict]) -> tuple[dict[str, int], dict[str, int]]:
    """(errored rows by error type, by error kind: "unknown" when the row does not say)."""
    errors: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for r in rows:
        err = r.get("error_info") if isinstance(r.get("error_info"), dict) else r.get("error")  # rows before error_info: a dict
        et = (r.get("error_type") if r.get("error") else None) or error_type(err)
        if et:
            errors[et] = errors.get(et, 0) + 1
            kind = r.get("error_kind") or (err.get("kind") if isinstance(err, dict) else None) or "unknown"
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
    return errors, kinds


def swe_view(row: dict) -> dict:
    """A swe-debug row as one flat dict: the verdict (`info.verdict`) over the
    instance's info, with the row's error; an older flat row as it is."""
    info = row.get("info") if isinstance(row.get("info"), dict) else {}
    v = info.get("verdict")
    if not isinstance(v, dict):
        return row
    return {**{k: x for k, x in info.items() if k != "verdict"}, **v, "error": row.get("error")}


def summarize_swe(rows: list[dict]) -> dict:
    reasons: dict[str, int] = {}
    phases: dict[str, list[float]] = {}
    valid = 0
    for r in map(swe_view, rows):
        reason = str(r.get("reason") or ("pass" if r.get("valid") else "unknown"))
        reasons[reason] = reasons.get(reason, 0) + 1
        valid += bool(r.get("valid"))
        t = r.get("timings") if isinstance(r.get("timings"), dict) else {}
        for k, v in t.items():
            d = _dur(v)
            if d is not None:
                phases.setdefault(k, []).append(d)
    return {
        "kind": "swe-debug",
        "n": len(rows),
        "valid": valid,
        "reasons": reasons,
        "phase_timings": {k: percentiles(v) for k, v in sorted(phases.items())},
    }


def _tail(x: Any, limit: int = 4000) -> str:
    s = x if isinstance(x, str) else ("" if x is None else json.dumps(x))
    return s[-limit:]


def swe_instances(rows: list[dict]) -> list[dict]:
    out = []
    for r in map(swe_view, rows):
        out.append({
            "instance_id": r.get("instance_id") or r.get("id") or "?",
            "reason": r.get("reason"),
            "valid": r.get("valid"),
            "timings": {k: _dur(v) for k, v in (r.get("timings") or {}).items()}
            if isinstance(r.get("timings"), dict) else {},
            "error": error_text(r.get("error")),
            "detail": _tail(r.get("detail"), 2000) or None,
            "step": r.get("step"),
            "test_exit_code": r.get("test_exit_code"),
            "fail_to_pass": r.get("fail_to_pass") if isinstance(r.get("fail_to_pass"), dict) else None,
            "pass_to_pass": r.get("pass_to_pass") if isinstance(r.get("pass_to_pass"), dict) else None,
            "stdout_tail": _tail(r.get("stdout_tail") or r.get("test_output_tail")),
            "stderr_tail": _tail(r.get("stderr_tail")),
        })
    return out


def rows_by_example(rows: list[dict]) -> dict[Any, list[int]]:
    """Row indices by example id, examples in first-seen order, rows in row order."""
    by_ex: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        by_ex.setdefault(r.get("example_id", f"row{i}"), []).append(i)
    return by_ex


def sample_groups(rows: list[dict], offset: int = 0, limit: int = 20) -> dict:
    """Rollouts grouped by example (first-seen order), paged by group."""
    by_ex = rows_by_example(rows)
    groups = []
    for ex in list(by_ex)[offset: offset + limit]:
        rs = [rows[i] for i in by_ex[ex]]
        rewards = [(_num(r.get("reward")) or 0.0) for r in rs]
        groups.append({
            "example_id": ex,
            "prompt": rs[0].get("prompt"),
            "answer": rs[0].get("answer"),
            "reward": spread(rewards),
            "rollouts": [{
                "completion": r.get("completion"),
                "reward": _num(r.get("reward")),
                "metrics": r.get("metrics") if isinstance(r.get("metrics"), dict) else {},
                "tools": tools_called(r),
                "error": error_text(r.get("error")),
                "stop_condition": r.get("stop_condition"),
                "timing": timing_phases(r.get("timing")),
            } for r in rs],
        })
    return {"total_groups": len(by_ex), "offset": offset, "groups": groups}


# ------------------------------------------------------------ samples table


def _spans(timing: Any, key: str) -> list[float]:
    """Durations of a row's `timing[key].spans` (model calls / env responses)."""
    t = timing.get(key) if isinstance(timing, dict) else None
    spans = t.get("spans") if isinstance(t, dict) else None
    return [(_dur(s) or 0.0) for s in spans] if isinstance(spans, list) else []


def turn_timings(row: dict) -> list[dict[str, float | None]]:
    """Per turn: seconds waiting for the model and for the environment's answer."""
    model, env = _spans(row.get("timing"), "model"), _spans(row.get("timing"), "env")
    return [{"turn": i + 1, "model_s": model[i] if i < len(model) else None,
             "env_s": env[i] if i < len(env) else None} for i in range(max(len(model), len(env)))]


def total_tokens(row: dict) -> float | None:
    tu = row.get("token_usage")
    vals = [_num(v) for v in tu.values()] if isinstance(tu, dict) else []
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def _turns(row: dict) -> int:
    model = _spans(row.get("timing"), "model")
    if model:
        return len(model)
    traj = row.get("trajectory")
    if isinstance(traj, list) and traj:
        return len(traj)
    comp = row.get("completion")
    return sum(1 for m in comp if isinstance(m, dict) and m.get("role") == "assistant") if isinstance(comp, list) else 0


def _preview(messages: Any, limit: int = 300, last: bool = False) -> str:
    """Text of the last user message of a prompt (or of the last message: `last`), cut to `limit`."""
    if isinstance(messages, str):
        return messages[:limit]
    if not isinstance(messages, list):
        return ""
    msgs = [m for m in messages if isinstance(m, dict)]
    if not last:
        msgs = [m for m in msgs if m.get("role") == "user"] or msgs
    for m in reversed(msgs):
        c = m.get("content")
        text = c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if isinstance(p, dict)) if isinstance(c, list) else ""
        if text:
            return text[:limit]
    return ""


def sample_table(rows: list[dict]) -> dict:
    """One compact entry per rollout, groups in example order (first seen) and
    rollouts in row order inside a group: `idx` (the row's index, for the raw row),
    example, rollout, its OWN reward, metrics, error, turns, tokens, duration."""
    by_ex = rows_by_example(rows)
    out = []
    tokens_total = 0.0
    for ex in by_ex:
        for j, i in enumerate(by_ex[ex]):
            r = rows[i]
            tok = total_tokens(r)
            tokens_total += tok or 0.0
            out.append({
                "idx": i, "example_id": ex, "rollout": j, "reward": _num(r.get("reward")),
                "metrics": {k: v for k, v in (r.get("metrics") or {}).items()} if isinstance(r.get("metrics"), dict) else {},
                "error": error_text(r.get("error")), "error_kind": r.get("error_kind"),
                "turns": _turns(r), "tokens": tok, "duration": timing_phases(r.get("timing")).get("total"),
                "attempts": r.get("attempts"),
                "prompt_preview": _preview(r.get("prompt")), "completion_preview": _preview(r.get("completion"), last=True),
            })
    return {"rows": out, "n_groups": len(by_ex), "total_tokens": tokens_total}


def sample_detail(rows: list[dict], idx: int) -> dict | None:
    """The raw row `idx` with its per-turn timing and full error details."""
    if not 0 <= idx < len(rows):
        return None
    r = rows[idx]
    return {"idx": idx, "row": r, "turn_timing": turn_timings(r), "tokens": total_tokens(r),
            "error_info": r.get("error_info") if isinstance(r.get("error_info"), dict) else None}


def run_overview(rec: RunRecord) -> dict:
    """Cheap per-run figures for the runs list: avg reward and pass@k from the
    run's metadata.json (written by the eval as it goes), else from its rows."""
    if rec.kind == "swe-debug":
        s = summarize_swe(read_rows(rec))
        return {"avg_reward": (s["valid"] / s["n"]) if s["n"] else None, "pass_at_k": {}}
    meta = read_metadata(rec.output_dir)
    if isinstance(meta.get("avg_reward"), (int, float)) and isinstance(meta.get("pass_at_k"), dict):
        return {"avg_reward": meta["avg_reward"], "pass_at_k": meta["pass_at_k"]}
    rows = read_rows(rec)
    if not rows:
        return {"avg_reward": None, "pass_at_k": {}}
    s = summarize_eval(rows, meta)
    return {"avg_reward": s["reward"]["mean"], "pass_at_k": s["pass_at_k"]}
