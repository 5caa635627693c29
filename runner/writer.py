"""Results on disk: `{output_dir}/evals/{env_id}--{model}/{run_id}/` with
`results.jsonl` (one rollout per line, appended one completed group at a
time, flushed and fsynced) and `metadata.json` (rewritten atomically:
temp file + os.replace). A killed run loses at most the groups in flight.
The files themselves are written by `envs.results_file.ResultsWriter` (also
used by `Environment.generate(save_results=True)`); this module adds the
eval run's directory layout and resume.

Resume (`runner.resume` picks the run, by its id, and the rows it keeps):
`load_existing` reads back the rows (leaving out a torn last line and any
unusable line), `needs_rerun` picks out the rows that were not scored (they
are dropped and run again) and `missing_inputs` computes exactly the
rollouts still to run.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError

from envs.outputs import is_scored
from envs.results_file import METADATA, RESULTS, ResultsWriter, dumps, read_rows

__all__ = [
    "METADATA",
    "RESULTS",
    "ResultsWriter",
    "check_compatible",
    "dumps",
    "env_model_dir",
    "load_existing",
    "missing_inputs",
    "model_slug",
    "now_iso",
]


def model_slug(model: str) -> str:
    return model.replace("/", "--")


def env_model_dir(output_dir: str | Path | None, env_id: str, model: str) -> Path:
    base = Path(output_dir) if output_dir else Path("outputs")
    return base / "evals" / f"{env_id}--{model_slug(model)}"


def load_existing(run_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, metadata) of a previous run; unusable lines (a torn tail, garbage, binary
    junk) are left out (`runner.resume.load_run` reports each with its file and line)."""
    run_dir = Path(run_dir)
    res, meta = run_dir / RESULTS, run_dir / METADATA
    if not res.exists() or not meta.exists():
        raise ConfigError(f"--resume {run_dir}: not an eval results directory (needs {RESULTS} and {METADATA})")
    try:
        metadata = json.loads(meta.read_bytes().decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        raise ConfigError(f"--resume {run_dir}: {meta} is not valid JSON: {exc}") from None
    return read_rows(res).rows, metadata


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
