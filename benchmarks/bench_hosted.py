"""`--hosted` overhead: the same 1000-rollout eval against the local instant
model server (its own process), run local and through a one-machine Ray
cluster (a head started for the benchmark, stopped by pid at the end), in
one run:

- local `vf-sandbox eval` (one process): the baseline;
- `vf-sandbox eval --hosted --follow` with one worker actor, and with `-w 2`
  (two actors on this machine's cores).

For each: wall time of the whole command (the hosted one includes the Ray
job's start-up and pulling the results back), submit-to-first-row (the
command's start to the first row's end, from the rows' own timings, which
the actors stamp on the same clock), and the generation span (first row
start to last row end): steady-state throughput without the fixed
start-up. The hosted run's fixed costs are split into: submission (the
command until Ray accepted the job), job start (until the driver logged the
run), actors ready, and the pull-back after the last row.

Targets (issue 13): submit-to-first-row <= 5 s; hosted throughput >= 0.8x
local; 2 workers vs 1 >= 1.6x.

    .venv/bin/python benchmarks/bench_hosted.py [--examples 100] [--rollouts-per-example 10] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
VF = [sys.executable, "-m", "envs.cli.app"]
# a log line of the job (any format with an HH:MM:SS time before the logger name)
LOG_TIME = re.compile(r"(\d\d:\d\d:\d\d)\S*\s.*envs\.eval\.(hosted|ray_workers)\b.*?(hosted run|worker actor \d+ ready)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clock(hms: str, near: float) -> float:
    """An HH:MM:SS log time (this machine's local time) as an epoch time near `near`."""
    day = datetime.fromtimestamp(near)
    t = datetime.strptime(hms, "%H:%M:%S").replace(year=day.year, month=day.month, day=day.day)
    return t.timestamp()


def run_eval(base_url: str, out: Path, n: int, r: int, c: int, *extra: str) -> dict:
    e = {**os.environ, "VF_BENCH_KEY": "x", "VF_RUNS_DB": str(out / "runs.db")}
    argv = [*VF, "eval", "math-single", "-m", "bench", "-b", base_url, "-k", "VF_BENCH_KEY", "-n", str(n), "-r", str(r),
            "-c", str(c), "-s", "-d", "-A", "-o", str(out), *extra]
    marks: dict[str, float] = {}
    lines: list[str] = []
    t0 = time.time()
    p = subprocess.Popen(argv, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if "submitted to" in line and "submitted" not in marks:
                marks["submitted"] = time.time()
            m = LOG_TIME.search(line)
            if m:
                key = "job_started" if m.group(3) == "hosted run" else "actors_ready"
                marks[key] = _clock(m.group(1), t0)  # the last actor's for actors_ready

    reader = threading.Thread(target=read)
    reader.start()
    p.wait()
    reader.join()
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"eval {' '.join(extra)} failed:\n{''.join(lines)[-4000:]}")
    (res,) = sorted(out.glob("evals/*/*/results.jsonl"), key=lambda x: x.stat().st_mtime)[-1:]
    rows = [json.loads(line) for line in res.read_text().splitlines() if line.strip()]
    ends = [row["timing"]["start_time"] + row["timing"]["total"] for row in rows]
    first_start = min(row["timing"]["start_time"] for row in rows)
    return {"wall": wall, "rollouts": len(rows), "first_row": min(ends) - t0, "span": max(ends) - first_start,
            "after_last": t0 + wall - max(ends), "reward": sum(row["reward"] for row in rows) / len(rows),
            **{k: v - t0 for k, v in marks.items()}}


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
    cores = os.cpu_count() or 2
    cluster = RayCluster(nodes=1, cpus=(cores,))
    results: list[tuple[str, dict]] = []
    try:
        t0 = time.perf_counter()
        cluster.start()
        cluster_up = time.perf_counter() - t0
        hosted = ["--hosted", "--address", cluster.dashboard_url, "--follow", "--poll-interval", "0.5"]
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            n, r, c = a.examples, a.rollouts_per_example, a.concurrency
            run_eval(base_url, base / "warm", 1, 1, 1)  # page cache, server
            run_eval(base_url, base / "warm-hosted", 1, 1, 1, *hosted)  # the cluster's first job
            results.append(("local (baseline)", run_eval(base_url, base / "local", n, r, c)))
            results.append(("--hosted --follow", run_eval(base_url, base / "hosted", n, r, c, *hosted)))
            results.append(("--hosted --follow -w 2", run_eval(base_url, base / "hosted2", n, r, c, *hosted, "-w", "2")))
    finally:
        cluster.stop()
        server.terminate()
        server.wait(timeout=10)
    load = os.getloadavg()
    local, one, two = (x for _, x in results)
    print(f"\n{local['rollouts']} single-turn rollouts (math-single), -c {a.concurrency}, {cores} cores, instant local "
          f"model server; one-machine Ray cluster up in {cluster_up:.1f} s; load average {load[0]:.1f} "
          "(the machine is shared with other work: noisy)")
    print(f"{'variant':<26}{'wall s':>8}{'rollouts/s':>11}{'first row s':>12}{'gen span s':>11}{'gen rollouts/s':>15}"
          f"{'reward':>8}")
    for name, x in results:
        print(f"{name:<26}{x['wall']:>8.2f}{x['rollouts'] / x['wall']:>11.0f}{x['first_row']:>12.2f}{x['span']:>11.2f}"
              f"{x['rollouts'] / x['span']:>15.0f}{x['reward']:>8.3f}")
    print("\nhosted fixed costs (s from the command's start): "
          f"submitted {one.get('submitted', float('nan')):.2f}, job driver running {one.get('job_started', float('nan')):.0f}"
          f" (log time, 1 s resolution), actor ready {one.get('actors_ready', float('nan')):.0f}, first row "
          f"{one['first_row']:.2f}; after the last row: {one['after_last']:.2f} (job end, results pulled back); "
          f"local after the last row: {local['after_last']:.2f}")
    print(f"hosted vs local throughput, whole command: {local['wall'] / one['wall']:.2f}x   (target >= 0.8x)")
    print(f"hosted vs local throughput, generation span: {local['span'] / one['span']:.2f}x")
    print(f"hosted submit -> first row: {one['first_row']:.2f} s   (target <= 5 s); local: {local['first_row']:.2f} s")
    print(f"hosted -w 2 vs 1 actor, generation span: {one['span'] / two['span']:.2f}x, whole command: "
          f"{one['wall'] / two['wall']:.2f}x   (target >= 1.6x)")


if __name__ == "__main__":
    main()
