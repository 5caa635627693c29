"""`-w N` scaling and the eval runner's CPU per rollout, through the real
`vf-sandbox eval` (a subprocess per variant) against the local instant model
server (its own process), all in one run:

- `-w 1` (every rollout in the runner's process) is the baseline;
- `-w 2` on this machine's cores: wall time of the whole command, and the
  generation span (first rollout start to last rollout end, from the rows'
  own timings), which leaves out the workers' start-up;
- CPU per rollout at `-w 1`: the eval process's user+sys CPU for the full run
  minus a 1-rollout run of the same command (start-up: imports, env load),
  divided by the rollouts.

Targets (issue 12): `-w 2` vs `-w 1` >= 1.6x on 1000 rollouts; CPU per rollout
at `-w 1` <= 1.0 ms.

    .venv/bin/python benchmarks/bench_workers.py [--examples 100] [--rollouts-per-example 10] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VF = [sys.executable, "-m", "vfcli.app"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid: int) -> float:
    """user+sys CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_eval(base_url: str, out: Path, n: int, r: int, c: int, workers: int, server_pid: int) -> dict:
    """One `vf-sandbox eval math-single` run: wall, CPU (self + children), generation span."""
    env = {**os.environ, "VF_BENCH_KEY": "x", "VF_RUNS_DB": str(out / "runs.db")}
    argv = [*VF, "eval", "math-single", "-m", "bench", "-b", base_url, "-k", "VF_BENCH_KEY", "-n", str(n), "-r", str(r),
            "-c", str(c), "-w", str(workers), "-s", "-d", "-A", "-o", str(out)]
    server0 = proc_cpu(server_pid)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"eval -w {workers} failed:\n{err[-3000:]}")
    # wait4's usage covers the eval process and the workers it reaped (Linux accumulates children)
    (res,) = sorted(out.glob("evals/*/*/results.jsonl"), key=lambda p: p.stat().st_mtime)[-1:]
    rows = [json.loads(line) for line in res.read_text().splitlines() if line.strip()]
    starts = [row["timing"]["start_time"] for row in rows]
    ends = [row["timing"]["start_time"] + row["timing"]["total"] for row in rows]
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rollouts": len(rows), "server_cpu": proc_cpu(server_pid) - server0,
            "span": max(ends) - min(starts), "reward": sum(row["reward"] for row in rows) / len(rows)}


def median_run(runs: list[dict]) -> dict:
    """Field-wise medians of repeated runs of one variant."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--rollouts-per-example", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved -w 1 / -w N pairs; medians reported")
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "testmodel.model_server", "--port", str(port), "--policy", "compute"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            run_eval(base_url, base / "warm", 1, 1, 1, 1, server.pid)  # warm the page cache and the server
            startup = run_eval(base_url, base / "startup", 1, 1, 1, 1, server.pid)
            ones, manys = [], []
            for k in range(a.repeats):  # interleaved, so that load drift hits both variants
                ones.append(run_eval(base_url, base / f"w1-{k}", a.examples, a.rollouts_per_example, a.concurrency, 1,
                                     server.pid))
                manys.append(run_eval(base_url, base / f"w{a.workers}-{k}", a.examples, a.rollouts_per_example,
                                      a.concurrency, a.workers, server.pid))
            one, many = median_run(ones), median_run(manys)
    finally:
        server.terminate()
        server.wait(timeout=10)
    n = one["rollouts"]
    cpu_ms = (one["cpu"] - startup["cpu"]) / n * 1000
    print(f"\n{n} single-turn rollouts (math-single), -c {a.concurrency}, {os.cpu_count()} cores, instant local model server; "
          f"medians of {a.repeats} interleaved runs each")
    print(f"{'variant':<22}{'wall s':>9}{'rollouts/s':>12}{'gen span s':>12}{'gen rollouts/s':>16}{'avg reward':>12}")
    for name, r in (("-w 1 (baseline)", one), (f"-w {a.workers}", many)):
        print(f"{name:<22}{r['wall']:>9.2f}{r['rollouts'] / r['wall']:>12.0f}{r['span']:>12.2f}"
              f"{r['rollouts'] / r['span']:>16.0f}{r['reward']:>12.3f}")
    print(f"\n-w {a.workers} vs -w 1: {one['wall'] / many['wall']:.2f}x wall (incl. worker start-up), "
          f"{one['span'] / many['span']:.2f}x generation span   (target >= 1.6x)")
    print(f"CPU per rollout at -w 1: {cpu_ms:.2f} ms (run CPU {one['cpu']:.2f} s minus start-up {startup['cpu']:.2f} s)"
          f"   (target <= 1.0 ms)")
    server_ms = one["server_cpu"] / n * 1000
    cores = os.cpu_count() or 1
    # -w 1 is bound by one core running the eval; -w N by all cores shared with the model server
    ceiling = min(a.workers, cores * cpu_ms / (cpu_ms + server_ms)) if cpu_ms + server_ms > 0 else float("nan")
    print(f"model server CPU per request: {server_ms:.2f} ms on the same {cores} cores -> best possible -w {a.workers} "
          f"vs -w 1 here: {ceiling:.2f}x (all cores busy, eval and server sharing them)")


if __name__ == "__main__":
    main()
