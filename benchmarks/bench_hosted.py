"""`--hosted` overhead: the same 1000-rollout eval against the local instant
model server (its own process), run local and through a one-machine Ray
cluster (a head started for the benchmark, stopped by pid at the end), in
one run:

- local `vf-sandbox eval` (one process): the baseline;
- `vf-sandbox eval --hosted --follow`: submit-to-first-row (the submitting
  command's start to the first row's end, from the rows' own timings) and
  overall throughput (rollouts / wall time of the whole command, including
  the job's start-up and pulling the results back).

Targets (issue 13): submit-to-first-row <= 5 s; hosted throughput >= 0.8x local.

    .venv/bin/python benchmarks/bench_hosted.py [--examples 100] [--rollouts-per-example 10] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
VF = [sys.executable, "-m", "envs.cli.app"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_eval(base_url: str, out: Path, n: int, r: int, c: int, *extra: str, env: dict | None = None) -> dict:
    e = {**os.environ, "VF_BENCH_KEY": "x", "VF_RUNS_DB": str(out / "runs.db"), **(env or {})}
    argv = [*VF, "eval", "math-single", "-m", "bench", "-b", base_url, "-k", "VF_BENCH_KEY", "-n", str(n), "-r", str(r),
            "-c", str(c), "-s", "-d", "-A", "-o", str(out), *extra]
    t0_wall = time.time()
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"eval {' '.join(extra)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    (res,) = sorted(out.glob("evals/*/*/results.jsonl"), key=lambda x: x.stat().st_mtime)[-1:]
    rows = [json.loads(line) for line in res.read_text().splitlines() if line.strip()]
    first_end = min(row["timing"]["start_time"] + row["timing"]["total"] for row in rows)
    return {"wall": wall, "rollouts": len(rows), "first_row": first_end - t0_wall,
            "reward": sum(row["reward"] for row in rows) / len(rows)}


def main() -> None:
    from ray_cluster import RayCluster

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--rollouts-per-example", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=256)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "envs.testing.model_server", "--port", str(port), "--policy", "compute"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    cluster = RayCluster(nodes=1, cpus=(os.cpu_count() or 2,))
    try:
        t0 = time.perf_counter()
        cluster.start()
        cluster_up = time.perf_counter() - t0
        hosted = ["--hosted", "--address", cluster.dashboard_url, "--follow", "--poll-interval", "0.5"]
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            n, r, c = a.examples, a.rollouts_per_example, a.concurrency
            run_eval(base_url, base / "warm", 1, 1, 1)  # page cache, server
            run_eval(base_url, base / "warm-hosted", 1, 1, 1, *hosted)  # the cluster's first job (imports cached)
            local = run_eval(base_url, base / "local", n, r, c)
            remote = run_eval(base_url, base / "hosted", n, r, c, *hosted)
    finally:
        cluster.stop()
        server.terminate()
        server.wait(timeout=10)
    print(f"\n{local['rollouts']} single-turn rollouts (math-single), -c {a.concurrency}, {os.cpu_count()} cores, "
          f"instant local model server; one-machine Ray cluster up in {cluster_up:.1f} s")
    print(f"{'variant':<28}{'wall s':>9}{'rollouts/s':>12}{'submit->first row s':>21}{'avg reward':>12}")
    for name, x in (("local (baseline)", local), ("--hosted --follow", remote)):
        print(f"{name:<28}{x['wall']:>9.2f}{x['rollouts'] / x['wall']:>12.0f}{x['first_row']:>21.2f}{x['reward']:>12.3f}")
    print(f"\nhosted vs local throughput: {local['wall'] / remote['wall']:.2f}x   (target >= 0.8x)")
    print(f"hosted submit -> first row: {remote['first_row']:.2f} s   (target <= 5 s); local: {local['first_row']:.2f} s")


if __name__ == "__main__":
    main()
