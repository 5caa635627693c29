"""Where a run goes, and what a resume continues: one run id everywhere.

A new run gets an id from the run registry (`new_run_id`), which is also the
name of its results directory: `{output_dir}/evals/{env_id}--{model}/{run_id}/`.

`--resume REF` continues the run REF names: a run id (or unique prefix) or a
path (its results directory). A bare `--resume` continues the newest
*incomplete* run of the same definition found in the run registry (whatever
`-o` and the working directory are): a run whose status is not `completed`,
not running, made with the same env, model, -n, -r and everything else that
changes a rollout's result. A resume runs exactly the rollouts that were not
scored (errored rows are dropped and run again) plus the missing ones. It
never extends a completed run: a larger -n for a completed run is an explicit
`--extend`, or a new run.

The results file is read back line by line: a line that is not a JSON row
(garbage, binary junk) is reported with its file and line, dropped, and its
rollout runs again (it is missing); a torn last line (a killed writer) is
dropped the same way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError

from envs.outputs import is_scored  # the row's verdict kind is `scored`; a resume reruns every other row
from envs.results_file import METADATA, RESULTS, read_rows
from runner.config import EvalConfig

log = logging.getLogger("envs.runner")

@dataclass
class RunPlan:
    """Where this run's results go and what it starts from."""

    run_dir: Path
    run_id: str | None
    """The run id for the registry: a new run's (also its directory's name); None when
    resuming (the registry continues the row that owns `run_dir`)."""
    resumed: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The saved rows kept (scored rollouts); everything else runs again."""
    metadata: dict[str, Any] = field(default_factory=dict)
    dropped: int = 0
    """Saved rows not kept: errored rollouts, garbage lines, a torn tail."""
    prior_ms: float = 0.0
    first_date: str | None = None
    """The resumed run's original start date (metadata `date`): a resume keeps it."""

    @property
    def rewrite(self) -> bool:
        """The results file must be rewritten with `rows` before appending."""
        return self.dropped > 0


def run_dir_for(cfg: EvalConfig, run_id: str) -> Path:
    from runner.writer import env_model_dir

    return env_model_dir(cfg.output_dir, cfg.env_id, cfg.model) / run_id


def new_run(cfg: EvalConfig) -> tuple[str, Path]:
    """The run's id (the definition's `run_id`, else a fresh one) and its results directory (not created)."""
    from runs.registry import new_run_id

    rid = cfg.run_id or new_run_id()
    return rid, run_dir_for(cfg, rid)


def resolve_ref(ref: str, flag: str = "--resume", db: str | None = None) -> tuple[Path, Any]:
    """A run id / prefix or a results directory -> (results directory, registry row or None)."""
    from runs.registry import AmbiguousRunId, find_run

    p = Path(ref).expanduser()
    try:
        rec = find_run(ref, db)
    except AmbiguousRunId as exc:
        raise ConfigError(f"{flag} {ref}: {exc}; give more of the id") from None
    if p.is_dir():
        return p, rec
    if p.name in (RESULTS, METADATA) and p.parent.is_dir():
        return p.parent, rec
    if rec is None:
        raise ConfigError(f"{flag} {ref}: no run {ref!r} in the run registry and no such results directory "
                          "(list runs: vf-sandbox runs list)")
    return Path(rec.output_dir), rec


def _recorded_config(args: dict[str, Any]) -> EvalConfig | None:
    try:
        return EvalConfig.model_validate(args)
    except ValueError:
        return None


def find_incomplete(cfg: EvalConfig) -> Any:
    """The newest run in the registry of the same definition that is not completed and
    not running, with results on disk; None when there is none."""
    from runs.registry import is_hosted, list_runs

    for rec in list_runs(kind=cfg.kind, env_id=cfg.env_id, path=cfg.runs_db):
        if rec.env_id != cfg.env_id or rec.model != cfg.model or rec.status in ("completed", "running"):
            continue
        if is_hosted(rec) != bool(cfg.hosted):
            continue
        old = _recorded_config(rec.args)
        if old is None or old.num_examples != cfg.num_examples or old.rollouts_per_example != cfg.rollouts_per_example:
            continue
        if cfg.definition_diff(old):
            continue
        if not (Path(rec.output_dir) / RESULTS).exists():
            continue
        return rec
    return None


def load_run(run_dir: Path, flag: str = "--resume") -> tuple[list[dict[str, Any]], dict[str, Any], list[str], bool]:
    """(rows, metadata, bad-line reports, torn tail) of a saved run; ConfigError naming
    the file when it is not a results directory or its metadata is unreadable."""
    res, meta = run_dir / RESULTS, run_dir / METADATA
    if not res.exists() or not meta.exists():
        raise ConfigError(f"{flag} {run_dir}: not an eval results directory (needs {RESULTS} and {METADATA})")
    try:
        metadata = json.loads(meta.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{flag} {run_dir}: {meta} is not valid JSON ({exc}); start a new run, or restore the "
                          "file") from None
    if not isinstance(metadata, dict):
        raise ConfigError(f"{flag} {run_dir}: {meta} is not a JSON object")
    got = read_rows(res)
    return got.rows, metadata, got.bad_lines, got.torn_tail


def _recorded_num_examples(meta: dict[str, Any]) -> int:
    ec = meta.get("eval_config") if isinstance(meta.get("eval_config"), dict) else {}
    for value in (ec.get("num_examples"), meta.get("num_examples_requested"), meta.get("num_examples")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def plan_run(cfg: EvalConfig) -> RunPlan:
    """Where this eval's results go: a new run (new id and directory), or the run a
    `--resume` continues with the rows it keeps. Raises ConfigError (a usage error)
    when the resume cannot continue that run as asked."""
    from runner.writer import check_compatible, check_same_definition

    run_dir, rec = _resume_target(cfg) if cfg.resume else (None, None)
    if run_dir is None:
        rid, path = new_run(cfg)
        return RunPlan(run_dir=path, run_id=rid)
    if rec is not None and rec.status == "running":  # alive (the registry reconciles dead ones first)
        raise ConfigError(f"--resume {cfg.resume_path or rec.id}: run {rec.id} is still running (pid {rec.pid} on "
                          f"{rec.host}); two processes must not write one run: wait for it, or stop it first "
                          f"(vf-sandbox runs stop {rec.id}) and resume then")
    rows, meta, bad, torn = load_run(run_dir)
    check_compatible(meta, cfg.env_id, cfg.model, cfg.rollouts_per_example, cfg.num_examples, run_dir)
    check_same_definition(meta, cfg, run_dir)
    _refuse_silent_extension(cfg, rec, meta, run_dir)
    _log_dropped_lines(cfg, bad, torn, run_dir)
    kept = [r for r in rows if is_scored(r)]
    errored = len(rows) - len(kept)
    if errored:
        log.info("%s: %d saved rollout(s) were not scored (errors); running them again", cfg.env_id, errored)
    return RunPlan(run_dir=run_dir, run_id=None, resumed=True, rows=kept, metadata=meta,
                   dropped=errored + len(bad) + int(torn), prior_ms=float(meta.get("time_ms", 0.0) or 0.0),
                   first_date=meta.get("date") if isinstance(meta.get("date"), str) else None)


def _resume_target(cfg: EvalConfig) -> tuple[Path | None, Any]:
    """(run directory, registry record) a `--resume` continues: the run `resume_path` names, else the
    newest incomplete run of this definition; (None, None) when there is none (a new run then)."""
    if cfg.resume_path:
        return resolve_ref(cfg.resume_path, db=cfg.runs_db)
    rec = find_incomplete(cfg)
    if rec is None:
        log.info("%s: no incomplete run of this definition in the run registry; starting a new run", cfg.env_id)
        return None, None
    return Path(rec.output_dir), rec


def _refuse_silent_extension(cfg: EvalConfig, rec: Any, meta: dict[str, Any], run_dir: Path) -> None:
    """ConfigError when resuming a completed run with more examples than it recorded, without --extend."""
    name = rec.id if rec is not None else str(run_dir)
    recorded_n = _recorded_num_examples(meta)
    extends = cfg.num_examples != recorded_n and (cfg.num_examples < 0 or cfg.num_examples > recorded_n)
    completed = (rec.status if rec is not None else meta.get("status")) == "completed"
    if completed and extends and not cfg.extend:
        n = "all" if cfg.num_examples < 0 else str(cfg.num_examples)
        raise ConfigError(f"--resume {name}: run {name} is completed ({recorded_n} examples x "
                          f"{cfg.rollouts_per_example}); -n {n} would extend it. Add --extend to add the examples "
                          "to that run, or leave out --resume to start a new run")


def _log_dropped_lines(cfg: EvalConfig, bad: list[str], torn: bool, run_dir: Path) -> None:
    """Warn about the results lines a resume drops (unreadable ones, a last line cut short): they run again."""
    for line in bad:
        log.warning("%s: %s: dropped, its rollout runs again", cfg.env_id, line)
    if torn:
        log.warning("%s: %s: the last line is cut short (a writer killed mid-write): dropped, its rollout runs "
                    "again", cfg.env_id, run_dir / RESULTS)
