"""Submitting a run to a Ray cluster (`vf-sandbox eval ... --hosted`,
`vf-swe-debug --hosted`): the run definition goes to the cluster as a Ray
job, whose entrypoint is the ordinary runner (`hosted.driver`).

What the job gets, through Ray's runtime environment only:
- `working_dir`: a small staging directory with the definition
  (`.vf-run.json`), the environment package's files when it lives in a local
  directory (an env only installed as a package is imported by name on the
  cluster, which must have it installed), and, for `--resume`, the rows
  already pulled into the local run directory. Never a virtualenv or a
  cache: vf-sandbox itself (and Ray) must be installed on the cluster's
  nodes, the same version as here.
- `env_vars`: `--custom-secrets` and the model API key variable(s) of the
  definition when they are set here. Their values are never written to the
  results, the metadata, the run registry or our logs (the definition keeps
  only their names). Ray itself stores the runtime environment with the job:
  anyone who can reach the cluster's dashboard sees the values in the Jobs
  page, `ray job list` and `JobSubmissionClient.get_job_info()`.

The run is recorded in this machine's registry (`args.hosted`, `args.address`)
with a local output directory that the results are pulled into
(`--follow`, `vf-sandbox runs pull ID`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from sandboxes.errors import ConfigError, UsageError

from runner.config import EvalConfig
from hosted.driver import RESUME_DIR, SPEC_FILE, HostedJobSpec

ENTRYPOINT = "python -m hosted.driver"
MAX_STAGING_BYTES = 100 * 1024 * 1024  # Ray's working_dir limit
SKIP = {"__pycache__", ".venv", "venv", ".git", ".cache", "node_modules", "build", "dist", "outputs", ".pytest_cache"}
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STOP_WAIT_SECONDS = 90  # SIGTERM to SIGKILL: time for the actors to delete their sandboxes


def parse_secrets(obj: dict[str, Any]) -> dict[str, str]:
    """--custom-secrets: a JSON object of environment variable name -> string value."""
    out = {}
    for k, v in obj.items():
        if not _VAR.match(k):
            raise ConfigError(f"--custom-secrets: {k!r} is not an environment variable name")
        if not isinstance(v, (str, int, float, bool)):
            raise ConfigError(f"--custom-secrets: the value of {k} must be a string")
        out[k] = str(v)
    return out


def _copy_env_package(pkg: Path, dest: Path) -> None:
    for item in pkg.iterdir():
        if (item.name in SKIP or item.name.startswith(".venv") or item.name.endswith(".egg-info")  # .venv-*: any venv
                or item.name == "pyproject.toml"):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name,
                            ignore=shutil.ignore_patterns(*SKIP, "*.egg-info", "*.pyc"))
        else:
            shutil.copy2(item, dest / item.name)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def stage(cfg: EvalConfig, run_id: str, jid: str, resume_dir: Path | None) -> Path:
    """The job's working directory (a temp dir; the caller removes it)."""
    from envs.loader import env_package_dir

    staging = Path(tempfile.mkdtemp(prefix="vf-hosted-"))
    pkg = env_package_dir(cfg.env_id, cfg.env_dir_path)
    if pkg is not None and pkg.is_dir() and "site-packages" not in pkg.resolve().parts:
        _copy_env_package(pkg, staging)
    from hosted.jobs import sandbox_label

    # the run's ids travel in the definition (not in the job's environment); the registry file is the cluster's own
    job_cfg = cfg.model_copy(update={"run_id": run_id, "sandbox_run_id": sandbox_label(run_id), "runs_db": None})
    spec = HostedJobSpec(config=job_cfg, run_id=run_id, job_id=jid, resume=resume_dir is not None)
    (staging / SPEC_FILE).write_text(spec.model_dump_json(), encoding="utf-8")
    if resume_dir is not None:
        (staging / RESUME_DIR).mkdir()
        for name in ("results.jsonl", "metadata.json"):
            shutil.copyfile(resume_dir / name, staging / RESUME_DIR / name)
    size = _size(staging)
    if size > MAX_STAGING_BYTES:
        shutil.rmtree(staging, ignore_errors=True)
        raise ConfigError(f"the job's files are {size / 2**20:.0f} MiB (environment package {pkg}"
                          f"{' + resumed rows' if resume_dir else ''}); Ray takes at most 100 MiB")
    return staging


def job_env_vars(cfg: EvalConfig, secrets: dict[str, str]) -> dict[str, str]:
    """The job's environment: the secrets, the model key(s) and the registry credentials
    set here (the run's ids and other process settings travel in the run definition,
    `.vf-run.json`, which never holds a credential)."""
    keys = {}
    for replica in cfg.client_config.replicas():
        var = replica.api_key_var
        if var and var != "EMPTY" and var in os.environ:
            keys[var] = os.environ[var]
    creds = cfg.settings.credential_variables() if cfg.settings is not None else {}
    return {**keys, **creds, **secrets, "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_SECONDS), "PYTHONUNBUFFERED": "1"}


def submit(cfg: EvalConfig, secrets: dict[str, str]) -> Any:
    """Record the run here and submit it as a Ray job; returns its registry row."""
    from runs import registry
    from hosted.jobs import job_id, jobs_client
    from runner.resume import find_incomplete, new_run, resolve_ref

    from runner.config import normalise_address

    cfg = cfg.model_copy(update={"hosted": True, "address": normalise_address(cfg.address or os.environ.get("RAY_ADDRESS"))})
    client = jobs_client(cfg.address)
    resume_dir: Path | None = None
    if cfg.resume:
        if cfg.resume_path:
            resume_dir = resolve_ref(cfg.resume_path, db=cfg.runs_db)[0]
        else:
            prior = find_incomplete(cfg)  # the newest incomplete hosted run of this definition in the registry
            resume_dir = Path(prior.output_dir) if prior is not None else None
        if resume_dir is not None and not (resume_dir / "results.jsonl").exists():
            raise ConfigError(f"--resume {resume_dir}: no results.jsonl there (pull the run first: vf-sandbox runs pull ID)")
    new_id, new_dir = new_run(cfg)  # one id: the registry row's and the results directory's name
    local_dir = resume_dir or new_dir
    local_dir.mkdir(parents=True, exist_ok=True)
    rec = registry.RunRecorder.start(kind=cfg.kind, name=cfg.name, env_id=cfg.env_id, model=cfg.model,
                                     args=cfg.public_args(), output_dir=local_dir, run_id=new_id,
                                     resume=resume_dir is not None, capture_logging=False, db=cfg.runs_db)
    rec.detach()
    row = registry.get_run(rec.id, cfg.runs_db)
    assert row is not None
    jid = job_id(row)
    staging = stage(cfg, row.id, jid, resume_dir)
    try:
        client.submit_job(entrypoint=ENTRYPOINT, submission_id=jid,
                          runtime_env={"working_dir": str(staging), "env_vars": job_env_vars(cfg, secrets)},
                          metadata={"vf_run_id": row.id, "vf_env_id": cfg.env_id, "vf_name": cfg.name or "",
                                    "vf_kind": cfg.kind})
    except Exception as exc:  # noqa: BLE001 - record why, then report it
        registry.mark_status(row.id, "failed", path=cfg.runs_db, error=f"submission to {cfg.address} failed: {exc}")
        raise UsageError(f"cannot submit the run to the Ray cluster at {cfg.address}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return row


def run_hosted(configs: list[EvalConfig], secrets: dict[str, str], follow: bool, poll_interval: float,
               out: IO[str] | None = None) -> int:
    """Submit every config; with `follow`, stream each run's log until it ends and
    return 0 only when all completed."""
    from hosted import jobs as hosted

    out = out or sys.stdout
    if not follow and any(cfg.junit_xml for cfg in configs):
        raise ConfigError("--junit-xml with --hosted needs --follow (the report is written when the run ends)")
    rows = []
    for cfg in configs:
        row = submit(cfg, secrets)
        cfg = cfg.model_copy(update={"address": row.args.get("address")})
        rows.append((cfg, row))
        out.write(f"run {row.id}: submitted to {cfg.address} as Ray job {hosted.job_id(row)}\n"
                  f"  follow:  vf-sandbox runs logs {row.id} --follow\n"
                  f"  status:  vf-sandbox runs show {row.id}\n"
                  f"  stop:    vf-sandbox runs stop {row.id}\n"
                  f"  results: vf-sandbox runs pull {row.id}   (into {row.output_dir})\n")
        out.flush()
    if not follow:
        return 0
    code = 0
    for cfg, row in rows:
        final = hosted.follow(row, poll_interval=poll_interval, out=out)
        if cfg.junit_xml:
            _write_junit(cfg, final)
        out.write(f"run {final.id}: {final.status}" + (f": {final.error}" if final.error else "")
                  + f"\nresults: {final.output_dir}\n")
        out.flush()
        if final.status != "completed":
            code = 1
    return code


def _write_junit(cfg: EvalConfig, rec: Any) -> None:
    from runner.junit import write_junit
    from runner.writer import load_existing

    try:
        rows, meta = load_existing(rec.output_dir)
        write_junit(cfg.junit_xml, rows, meta)
    except (ConfigError, OSError) as exc:
        print(f"cannot write the JUnit report {cfg.junit_xml}: {exc}", file=sys.stderr)
