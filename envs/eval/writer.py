"""Results on disk: `{output_dir}/evals/{env_id}--{model}/{run_id}/` with
`results.jsonl` (one rollout per line, appended one completed group at a
time, flushed and fsynced) and `metadata.json` (rewritten atomically:
temp file + os.replace). A killed run loses at most the groups in flight.
The files themselves are written by `envs.results_file.ResultsWriter` (also
used by `Environment.generate(save_results=True)`); this module adds the
eval run's directory layout and resume.

Resume: `load_existing` reads back the rows (ignoring a torn last line),
`needs_rerun` picks out the rows that end in an infrastructure error (they
are dropped and run again) and `missing_inputs` computes exactly the
rollouts still to run.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError

from ..outputs import is_scored
from ..results_file import METADATA, RESULTS, ResultsWriter, dumps

__all__ = [
    "METADATA",
    "RESULTS",
    "ResultsWriter",
    "check_compatible",
    "dumps",
    "env_model_dir",
    "find_resumable",
    "load_existing",
    "missing_inputs",
    "model_slug",
    "new_run_dir",
    "now_iso",
]


def model_slug(model: str) -> str:
    return model.replace("/", "--")


def env_model_dir(output_dir: str | Path | None, env_id: str, model: str) -> Path:
    base = Path(output_dir) if output_dir else Path("outputs")
    return base / "evals" / f"{env_id}--{model_slug(model)}"


def new_run_dir(output_dir: str | Path | None, env_id: str, model: str) -> Path:
    return env_model_dir(output_dir, env_id, model) / uuid.uuid4().hex[:8]


def load_existing(run_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, metadata) of a previous run; a torn last line is ignored."""
    run_dir = Path(run_dir)
    res, meta = run_dir / RESULTS, run_dir / METADATA
    if not res.exists() or not meta.exists():
        raise ConfigError(f"--resume {run_dir}: not an eval results directory (needs {RESULTS} and {METADATA})")
    try:
        metadata = json.loads(meta.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"--resume {run_dir}: {METADATA} is not valid JSON: {exc}") from None
    rows = []
    with open(res, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # torn tail from a killed writer
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return rows, metadata


def needs_rerun(row: dict[str, Any]) -> bool:
    """A row whose rollout was not scored (a model / sandbox / env / usage error, retries
    spent): no result on the task, so a resume runs it again."""
    return not is_scored(row)


def check_compatible(metadata: dict[str, Any], env_id: str, model: str, rollouts_per_example: int, num_examples: int, where: Path) -> None:
    """Refuse to resume a run made with different settings (num_examples may only grow)."""
    problems = []
    if metadata.get("env_id") != env_id:
        problems.append(f"env_id {metadata.get('env_id')!r} != {env_id!r}")
    if metadata.get("model") != model:
        problems.append(f"model {metadata.get('model')!r} != {model!r}")
    if int(metadata.get("rollouts_per_example", -1)) != rollouts_per_example:
        problems.append(f"rollouts_per_example {metadata.get('rollouts_per_example')} != {rollouts_per_example}")
    saved_n = int(metadata.get("num_examples", 0))
    if num_examples >= 0 and saved_n > num_examples:
        problems.append(f"num_examples {saved_n} > {num_examples} (may only grow)")
    if problems:
        raise ConfigError(f"--resume {where}: incompatible with this run: " + "; ".join(problems))


def check_same_definition(metadata: dict[str, Any], cfg: Any, where: Path) -> None:
    """Refuse to resume when the recorded run definition differs from this one in
    anything that changes a rollout's result (env args, sampling, model, ...)."""
    recorded = metadata.get("eval_config")
    if not recorded:
        return  # results written before definitions were recorded: the basic checks above apply
    try:
        old = type(cfg).model_validate(recorded)
    except ValueError as exc:
        raise ConfigError(f"--resume {where}: its recorded run definition is unreadable ({exc}); start a new run") from None
    changed = cfg.definition_diff(old)
    if changed:
        raise ConfigError(f"--resume {where}: the run definition changed since its rows were written: "
                          + "; ".join(changed) + ". Start a new run (without --resume) to evaluate the new settings.")


def _content_key(row: dict[str, Any]) -> str:
    return json.dumps([row.get("prompt"), row.get("answer")], sort_keys=True, default=str)


def check_same_inputs(inputs: list[dict[str, Any]], rows: list[dict[str, Any]], where: Path) -> None:
    """Refuse to reuse a saved row whose example no longer has the same prompt/answer
    (the dataset changed under the same example ids), naming the examples."""
    current = {inp["example_id"]: _content_key(inp) for inp in inputs}
    changed = sorted({str(r.get("example_id")) for r in rows
                      if r.get("example_id") in current and "prompt" in r and _content_key(r) != current[r["example_id"]]})
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ConfigError(f"--resume {where}: the dataset changed: the saved rows of example(s) {shown} have another "
                          "prompt or answer now. Start a new run (without --resume).")


def find_resumable(output_dir: str | Path | None, env_id: str, model: str, rollouts_per_example: int, num_examples: int) -> Path | None:
    """The most recent incomplete run dir of env_id/model with matching settings."""
    base = env_model_dir(output_dir, env_id, model)
    if not base.is_dir():
        return None
    candidates = []
    for d in base.iterdir():
        meta = d / METADATA
        if not (d / RESULTS).exists() or not meta.exists():
            continue
        try:
            md = json.loads(meta.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if md.get("env_id") != env_id or md.get("model") != model:
            continue
        if int(md.get("rollouts_per_example", -1)) != rollouts_per_example:
            continue
        saved_n = int(md.get("num_examples", 0))
        if num_examples >= 0 and saved_n > num_examples:
            continue
        target = (num_examples if num_examples >= 0 else saved_n) * rollouts_per_example
        done = sum(1 for row in load_existing(d)[0] if not needs_rerun(row))
        if md.get("status") == "completed" and done >= target:
            continue
        if done >= target and target > 0:
            continue
        candidates.append((meta.stat().st_mtime, d))
    if not candidates:
        return None
    return max(candidates)[1]


def missing_inputs(inputs: list[dict[str, Any]], rows: list[dict[str, Any]], rollouts_per_example: int) -> list[dict[str, Any]]:
    """The inputs still to run: per example, rollouts_per_example minus what is saved."""
    done = Counter(r.get("example_id") for r in rows)
    need: Counter[Any] = Counter()
    out = []
    for inp in inputs:
        ex = inp["example_id"]
        need[ex] += 1
        if need[ex] > done.get(ex, 0):
            out.append(inp)
    return out


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
