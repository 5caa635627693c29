"""A Harbor oracle run on vf-sandbox (integrations/harbor_env.py) vs Harbor's own Docker
environment, on the same tasks, same run.

Each row is a real `harbor run` (Harbor's CLI from .venv-harbor) of its oracle agent on
the same task set: examples/harbor_tasks (the three the provider runs: fix-mean-bug,
primes-with-timeout, word-counts) and tests/data/harbor_provider_task, `--n-attempts K`
trials each at `--n-concurrent N`:

  vf cells        --env integrations.harbor_env:VfHarborEnvironment --ek rollout_isolation=cell
  vf containers   the same, rollout_isolation=container (a container per trial)
  harbor docker   --env docker: Harbor's own environment (docker compose v2: build, up, exec
                  and cp through the compose CLI, down)

Harbor's Docker environment can enforce `network_mode = "no-network"` only through its
egress-control sidecar, an image it builds FROM a registry image (gogost/gost) that cannot
be fetched offline: it refuses no-network tasks here. Its row therefore runs copies of the
tasks with the network line removed (Harbor's default, public); everything else (files,
Dockerfiles, tests, solutions, timeouts, resources) is identical. Our rows run the tasks
as they are (no network).

Before the timed rounds each row runs once untimed (images built: ours by our image
builder, Harbor's by `docker compose build`; both then cached). Rounds interleave the
rows (rotated each round) so a loaded machine moves every row alike. Reported per row:
the job's wall time as Harbor records it (result.json started_at -> finished_at; the
CLI's import time is not in it) and of the whole CLI process, trials/s, the p50 of
Harbor's per-trial environment set-up and of a trial, and that every trial got reward 1
(a row with a failed trial is marked INVALID). The last line is the ratio harbor docker
/ vf cells of the job wall time (the same for vf containers).

    .venv/bin/python benchmarks/bench_harbor.py [--attempts 3] [--concurrency 2] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
EXAMPLES = ["fix-mean-bug", "primes-with-timeout", "word-counts"]
OWN_TASK = ROOT / "tests" / "data" / "harbor_provider_task"
PROVIDER = "integrations.harbor_env:VfHarborEnvironment"
BENCH_LABEL = "vf-bench"


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end.replace("Z", "+00:00")) -
            datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def make_tasks(root: Path) -> tuple[Path, Path]:
    """(offline tasks as they are, the same tasks with their network line removed)."""
    offline, public = root / "offline", root / "public"
    for name in EXAMPLES:
        shutil.copytree(ROOT / "examples" / "harbor_tasks" / name, offline / name)
    shutil.copytree(OWN_TASK, offline / "answer")
    shutil.copytree(offline, public)
    for toml in public.glob("*/task.toml"):
        lines = [ln for ln in toml.read_text().splitlines(keepends=True) if not ln.startswith("network_mode")]
        toml.write_text("".join(lines))
    return offline, public


def rows(offline: Path, public: Path, compose: bool, label: str) -> dict[str, tuple[Path, list[str]]]:
    vf = ["--env", PROVIDER, "--ek", f"labels={json.dumps({BENCH_LABEL: label})}"]
    out = {
        "vf cells": (offline, [*vf, "--ek", "rollout_isolation=cell"]),
        "vf containers": (offline, [*vf, "--ek", "rollout_isolation=container"]),
    }
    if compose:
        out["harbor docker"] = (public, ["--env", "docker"])
    return out


def run_job(tasks: Path, env_args: list[str], jobs: Path, name: str, attempts: int, concurrency: int) -> dict:
    """One `harbor run` of the oracle; its timings and verdicts from Harbor's own files."""
    cmd = [str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", *env_args, "-o", str(jobs), "--job-name", name,
           "-y", "-q", "-n", str(concurrency), "-k", str(attempts)]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"harbor run failed ({name}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    job = json.loads((jobs / name / "result.json").read_text())
    trials = [json.loads(p.read_text()) for p in (jobs / name).glob("*/result.json")]
    setup = [_seconds(t["environment_setup"]["started_at"], t["environment_setup"]["finished_at"])
             for t in trials if t.get("environment_setup")]
    trial = [_seconds(t["started_at"], t["finished_at"]) for t in trials]
    ok = all(t["exception_info"] is None and (t["verifier_result"] or {}).get("rewards", {}).get("reward") == 1
             for t in trials)
    return {"job_s": _seconds(job["started_at"], job["finished_at"]), "cli_s": wall, "trials": len(trials),
            "all_reward_1": ok, "setup_p50_s": statistics.median(setup) if setup else None,
            "trial_p50_s": statistics.median(trial) if trial else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=3, help="trials per task (harbor -k)")
    ap.add_argument("--concurrency", type=int, default=2, help="concurrent trials (harbor -n)")
    ap.add_argument("--rounds", type=int, default=2, help="timed runs of each row (interleaved)")
    ap.add_argument("--json", action="store_true", help="also write benchmarks/results/bench_harbor.json")
    args = ap.parse_args()
    if not HARBOR.is_file():
        raise SystemExit(f"no Harbor at {HARBOR}: scripts/setup.sh makes .venv-harbor")
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if not compose:
        print("docker compose v2 is missing (scripts/setup.sh installs it): Harbor's docker row is skipped, "
              "the comparison is vf cells vs vf containers only", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-harbor-") as tmp:
        offline, public = make_tasks(Path(tmp))
        label = "harbor-" + uuid.uuid4().hex[:8]  # our sandboxes and the images built for them
        table = rows(offline, public, compose, label)
        jobs = Path(tmp) / "jobs"
        for name, (tasks, env_args) in table.items():  # untimed: images built and cached
            run_job(tasks, env_args, jobs, f"warm-{name.replace(' ', '-')}", 1, args.concurrency)
        samples: dict[str, list[dict]] = {name: [] for name in table}
        names = list(table)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                tasks, env_args = table[name]
                samples[name].append(run_job(tasks, env_args, jobs, f"r{r}-{name.replace(' ', '-')}",
                                             args.attempts, args.concurrency))
    ids = subprocess.run(["docker", "images", "-q", "--filter", f"label={BENCH_LABEL}={label}"], capture_output=True,
                         text=True).stdout.split()
    if ids:  # the task images our rows built (Harbor's docker row keeps its compose images, as it does)
        subprocess.run(["docker", "rmi", *sorted(set(ids))], capture_output=True)
    n_trials = len(EXAMPLES) + 1
    print(f"Harbor oracle run: {n_trials} tasks x {args.attempts} attempts at -n {args.concurrency}, "
          f"{args.rounds} timed rounds (medians)")
    print(f"{'row':<15} {'job s':>7} {'cli s':>7} {'trials/s':>9} {'setup p50':>10} {'trial p50':>10}  verdicts")
    summary = {}
    for name, runs in samples.items():
        job_s = statistics.median(s["job_s"] for s in runs)
        cli_s = statistics.median(s["cli_s"] for s in runs)
        setup = statistics.median(s["setup_p50_s"] for s in runs)
        trial = statistics.median(s["trial_p50_s"] for s in runs)
        ok = all(s["all_reward_1"] for s in runs)
        summary[name] = {"job_s": job_s, "cli_s": cli_s, "trials_per_s": runs[0]["trials"] / job_s,
                         "setup_p50_s": setup, "trial_p50_s": trial, "all_reward_1": ok, "runs": runs}
        print(f"{name:<15} {job_s:>7.2f} {cli_s:>7.2f} {runs[0]['trials'] / job_s:>9.2f} {setup:>10.3f} "
              f"{trial:>10.3f}  {'all reward 1' if ok else 'INVALID: a trial failed'}")
    if "harbor docker" in summary:
        base = summary["harbor docker"]["job_s"]
        for name in ("vf cells", "vf containers"):
            print(f"harbor docker / {name}: {base / summary[name]['job_s']:.2f}x job wall time")
    else:
        print(f"vf containers / vf cells: {summary['vf containers']['job_s'] / summary['vf cells']['job_s']:.2f}x "
              "job wall time (Harbor's docker row skipped: no docker compose v2)")
    if args.json:
        out = ROOT / "benchmarks" / "results" / "bench_harbor.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"attempts": args.attempts, "concurrency": args.concurrency,
                                   "rounds": args.rounds, "rows": summary}, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
