"""Run-registry costs, against baselines measured in the same run.

1. Writer: cost of one `RunRecorder.progress()` call (as the eval CLI calls it
   per finished group) — throttled (the default), and forced to commit every
   call — against the alternative design, an atomic JSON-file rewrite per
   update (write temp + fsync-free os.replace), and against an empty call.
2. Reader: `list_runs()` over 1,000 runs (includes the liveness reconcile)
   against reading 1,000 per-run JSON files.
3. Concurrency: 4 processes committing 300 updates each at once, against one
   process doing the same 1,200 updates alone (start-up excluded).

    .venv/bin/python benchmarks/bench_runs.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runs import registry  # noqa: E402


def per_call(fn, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n * 1e6  # µs


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    os.environ["VF_RUNS_DB"] = str(tmp / "runs.db")
    rows: list[tuple[str, float, str, float]] = []

    # 1. writer
    N = 3000
    rec = registry.RunRecorder.start(kind="eval", env_id="bench", output_dir=tmp / "o", capture_logging=False)
    noop = per_call(lambda i: None, N)
    throttled = per_call(lambda i: rec.progress(completed=i, total=N * 10), N)
    forced = per_call(lambda i: rec.progress(completed=i, total=i), N)
    rec.finish("completed")
    jf = tmp / "run.json"

    def json_rewrite(i):
        tmpf = jf.with_suffix(".tmp")
        tmpf.write_text(json.dumps({"id": "x", "completed": i, "total": N, "status": "running"}))
        os.replace(tmpf, jf)

    jrw = per_call(json_rewrite, N)
    rows += [
        ("progress(), throttled (default)", throttled, "JSON file rewrite per update", jrw),
        ("progress(), commit every call", forced, "JSON file rewrite per update", jrw),
        ("progress(), throttled (default)", throttled, "empty Python call", noop),
    ]

    # 2. reader
    with registry.connect() as conn:
        now = time.time()
        conn.execute("BEGIN")
        for i in range(1000):
            conn.execute(
                "INSERT INTO runs (id, kind, env_id, output_dir, log_path, host, pid, status, started_at, "
                "first_started_at, updated_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (f"r{i}", "eval", f"env{i % 7}", f"/o/{i}", f"/l/{i}", "h", 1, "completed", now - i, now - i, now, now))
        conn.execute("COMMIT")
    jd = tmp / "json-runs"
    jd.mkdir()
    for i in range(1000):
        (jd / f"r{i}.json").write_text(json.dumps({"id": f"r{i}", "env_id": f"env{i % 7}", "status": "completed",
                                                    "started_at": now - i}))
    t = time.perf_counter()
    for _ in range(10):
        assert len(registry.list_runs()) == 1001
    lr = (time.perf_counter() - t) / 10 * 1e3
    t = time.perf_counter()
    for _ in range(10):
        runs = [json.loads(p.read_text()) for p in jd.glob("*.json")]
        runs.sort(key=lambda r: -r["started_at"])
    lj = (time.perf_counter() - t) / 10 * 1e3
    rows.append(("list_runs(), 1,000 runs (ms)", lr, "read 1,000 JSON files (ms)", lj))

    # 3. concurrency
    # Each process sleeps until a common start instant, then times its update
    # loop; wall = last end - start (interpreter start-up excluded).
    writer = ("import sys, time\nfrom runs.registry import RunRecorder\n"
              "rec = RunRecorder.start(kind='eval', env_id='c', output_dir=sys.argv[1], capture_logging=False)\n"
              "time.sleep(max(0, float(sys.argv[3]) - time.time()))\n"
              "for i in range(int(sys.argv[2])):\n    rec.progress(completed=i, total=i)\n"
              "print(time.time(), flush=True)\nrec.finish('completed')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run_procs(k, n):
        start = time.time() + 3.0
        ps = [subprocess.Popen([sys.executable, "-c", writer, str(tmp / f"c{k}-{j}"), str(n), str(start)],
                               env=env, stdout=subprocess.PIPE, text=True) for j in range(k)]
        ends = [float(p.communicate()[0]) for p in ps]
        assert all(p.returncode == 0 for p in ps)
        return (max(ends) - start) * 1e3

    solo = run_procs(1, 1200)
    four = run_procs(4, 300)
    rows.append(("4 writers x 300 commits (ms)", four, "1 writer x 1,200 commits (ms)", solo))

    print(f"{'measure':<36} {'value':>10}   {'baseline':<32} {'value':>10} {'ratio':>8}")
    for name, v, bname, b in rows:
        unit = "" if "(ms)" in name else " µs"
        print(f"{name:<36} {v:>8.1f}{unit:3} {bname:<32} {b:>8.1f}{unit:3} {v / b:>8.3f}x")


if __name__ == "__main__":
    main()
