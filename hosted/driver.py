"""The entrypoint of a hosted run's Ray job: `python -m hosted.driver`.

Ray starts it on the head node in the job's working directory, which holds
the run definition (`.vf-run.json`, written by `hosted.submit`), the
environment package's files when it was shipped from a local directory
(importable by name from there, in this process and in every actor), and the
rows of an earlier attempt when the run is resumed (`resume/`).

It checks the run's permissions before anything else (a run whose
environment uses sandboxes needs `--allow-sandbox-access`; one that would
create instances or pods, the `kubernetes` and `prime` backends, also needs
`--allow-instances-access`): a missing one fails the job at once with a
"missing permission" error and no rollout. Then it is the ordinary runner
(`run_evals`, on the environment loaded for that check) with the run's
groups on Ray actors (`runner.ray_workers`), and on this process until
they are ready.
The results go to `<Ray logs dir of the head node>/vf-sandbox/<job id>/`,
the one place Ray serves files from over its HTTP API: the submitting
machine (`--follow`, `vf-sandbox runs pull`) fetches them from there.

Secrets (`--custom-secrets`, the model API key, the registry credentials)
arrive as environment variables of the job's runtime environment; nothing
here prints or records their values. Every other process setting is the
submitter's, in the run definition (`EvalConfig.settings`): `main` runs the
job in that settings scope (`sandboxes.settings.use`), with only the
credentials taken from the job's environment.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from pathlib import Path

from pydantic import BaseModel

from sandboxes.errors import ConfigError, UsageError

from hosted.jobs import RESULTS_SUBDIR, sandbox_label  # RESULTS_SUBDIR: under the head node's Ray logs directory; pulled back from there
from runner.config import RUN_IDS, EvalConfig
from runner.writer import ResultsWriter, env_model_dir

SPEC_FILE = ".vf-run.json"
RESUME_DIR = "resume"
INSTANCE_BACKENDS = ("kubernetes", "prime")  # backends that create pods / machines

log = logging.getLogger("envs.hosted")


class HostedJobSpec(BaseModel):
    """What the submitting machine ships in the job's working directory."""

    config: EvalConfig
    run_id: str
    job_id: str
    resume: bool = False


class MissingPermission(UsageError):
    """The run needs a permission it was not given (--allow-sandbox-access / --allow-instances-access)."""


def uses_sandboxes(env: object) -> bool:
    """Whether an environment creates sandboxes: sandbox-backed envs take the run's
    backend (they override `set_backend`); an env group if any member does."""
    from envs.environment import Environment

    members = getattr(env, "envs", None)
    if isinstance(members, list) and members and all(isinstance(e, Environment) for e in members):
        return any(uses_sandboxes(e) for e in members)
    return type(env).set_backend is not Environment.set_backend


def check_permissions(cfg: EvalConfig, env: object) -> None:
    """Raise MissingPermission when the run needs a permission it lacks."""
    if not uses_sandboxes(env):
        return
    if not cfg.allow_sandbox_access:
        raise MissingPermission(
            f"missing permission: environment {cfg.env_id!r} runs code in sandboxes; "
            "submit the run with --allow-sandbox-access")
    if cfg.backend in INSTANCE_BACKENDS and not cfg.allow_instances_access:
        raise MissingPermission(
            f"missing permission: the {cfg.backend!r} backend creates instances/pods; "
            "submit the run with --allow-instances-access")


def prepare(spec: HostedJobSpec, results_root: Path) -> EvalConfig:
    """The run definition as this job runs it: results under `results_root`, a resumed
    run's shipped rows in place."""
    base = results_root / spec.job_id
    base.mkdir(parents=True, exist_ok=True)
    cfg = spec.config
    update: dict[str, object] = {"output_dir": str(base), "save_results": True, "junit_xml": None,
                                 "resume": False, "resume_path": None,
                                 # the ids the submitter recorded travel in the definition; the registry is this job's own
                                 "run_id": spec.run_id, "sandbox_run_id": cfg.sandbox_run_id or sandbox_label(spec.run_id),
                                 "runs_db": str(base / "runs.db")}
    shipped = Path(RESUME_DIR)
    if spec.resume and (shipped / "results.jsonl").exists() and (shipped / "metadata.json").exists():
        run_dir = env_model_dir(base, cfg.env_id, cfg.model) / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "metadata.json"):
            shutil.copyfile(shipped / name, run_dir / name)
        update.update(resume=True, resume_path=str(run_dir))
    return cfg.model_copy(update=update)


def main() -> int:
    from envs.logging_utils import setup_logging

    # milliseconds: the job's log is how its start-up and hand-over are timed (benchmarks/bench_hosted.py)
    setup_logging("INFO", stream=sys.stdout, log_format="%(asctime)s.%(msecs)03d - %(name)s - %(levelname)s - %(message)s")
    spec = HostedJobSpec.model_validate_json(Path(SPEC_FILE).read_text(encoding="utf-8"))
    import ray

    ray.init(log_to_driver=True)
    from sandboxes import settings

    from runner.group_runner import run_settings

    try:
        cfg = prepare(spec, Path(ray._private.worker._global_node.get_logs_dir_path()) / RESULTS_SUBDIR)  # the dir Ray's log API serves
        if cfg.settings is None:  # a definition staged without settings: this job's environment says them
            cfg = cfg.model_copy(update={"settings": settings.ProcessSettings.from_env().model_copy(update=RUN_IDS)})
        with settings.use(run_settings(cfg, settings.ProcessSettings.from_env())):  # credentials: the job's env
            return _run(spec, cfg)
    finally:
        ray.shutdown()  # now: at interpreter exit Ray first sleeps 0.5 s for log lines (the actors are gone by then)


def _run(spec: HostedJobSpec, cfg: EvalConfig) -> int:
    log.info("hosted run %s (Ray job %s): %s, model %s, results in %s", spec.run_id, spec.job_id, cfg.env_id,
             cfg.model, cfg.output_dir)
    try:
        from runner.setup import load_run_env

        env = load_run_env(cfg)  # before any rollout: bad environments and missing permissions fail here
        check_permissions(cfg, env)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", flush=True)
        _write_failure(cfg, str(exc))
        return 1

    from runner.display import make_display, print_summary
    from runner.runner import run_evals

    display = make_display(True, False)
    with display:  # the runner uses `env` (loaded once) and runs groups on it until the actors are ready
        (res,) = asyncio.run(run_evals([cfg], display, loaded_envs=[env]))
    if res.metadata:
        print_summary(res.metadata, res.rows, abbreviated=True, plain=True)
    print(f"run {spec.run_id}: {res.status}" + (f": {res.error}" if res.error else ""), flush=True)
    return 0 if res.status == "completed" else 1


def _write_failure(cfg: EvalConfig, error: str) -> None:
    """A run that failed before the runner started still leaves a metadata.json saying why."""
    writer = ResultsWriter(env_model_dir(cfg.output_dir, cfg.env_id, cfg.model) / "not-started")
    writer.open()  # an empty results.jsonl
    writer.close()
    writer.write_metadata({
        "env_id": cfg.env_id, "model": cfg.model, "status": "failed", "error": error, "completed_rollouts": 0,
        "num_examples": cfg.num_examples, "rollouts_per_example": cfg.rollouts_per_example,
        "eval_config": cfg.public_args()})


if __name__ == "__main__":
    sys.exit(main())
